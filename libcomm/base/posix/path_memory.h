// What this process has learned about reaching other hosts, per (local interface, peer host):
// a dial that connected, or the error that made an address a miss (docs/topology.md, "Messy
// networks"). Every connection that follows reads it (the socket mesh of every communicator,
// its lazy connections and extra streams), so a path that failed once costs its time once.
// Process-wide and thread-safe; it only orders and explains, never forbids: an address known
// to fail is still tried, last.
#pragma once

#include <string>
#include <vector>

namespace comm::posix {

enum class PathVerdict { kUnknown, kWorks, kFails };

// Records an outcome; true when it changes what was known (the caller says so once, at INFO).
bool note_path(const std::string& local_if, const std::string& peer_host, bool works, const std::string& why);
PathVerdict path_verdict(const std::string& local_if, const std::string& peer_host);
// For a host not dialed yet through local_if: how that interface did with other hosts. kWorks
// when it reached one, kFails when it only failed, kUnknown when it was never used.
PathVerdict interface_verdict(const std::string& local_if);
// Local interfaces through which some peer host was reached, for the fix a failure suggests.
std::vector<std::string> interfaces_that_work();

}  // namespace comm::posix

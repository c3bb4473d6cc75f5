// Proving paths to other hosts with a TCP handshake each (docs/topology.md, "Reachability
// proven at init"): the init's reachability round (libcomm/src/reachability.cc)
// dials every published address of a few peer hosts at once, learns which answer, and closes.
// Only the kernel's handshake is needed: the peer's listener is up (it listened before the init
// verdict) and the handshake completes in its backlog, and the socket mesh drops a connection
// closed before its Hello quietly (transports/socket/mesh.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace comm::posix {

// ProbeResult::err besides 0 (answered) and an errno.
constexpr int kProbeNoAnswer = -1;    // the TCP handshake went unanswered (see waited_ms)
constexpr int kProbeOwnAddress = -2;  // an address of this host itself: never dialed

struct ProbeResult {
  std::string hostport;    // what was dialed, "10.77.0.2:41000"
  std::string local_if;    // the interface the kernel routes it through ("" no route)
  std::string local_addr;  // and the local address
  int err = 0;
  int waited_ms = 0;  // until the answer, or until given up
  bool gave_up_early = false;  // kProbeNoAnswer: another address of the group answered grace_ms before
};

// groups[g] holds the addresses of one peer host. Every address is dialed at once; one that
// does not answer is given up timeout_ms after the start, or grace_ms after another address of
// its group connected (an answer there proves the host is up and fast: Happy Eyeballs' 250 ms,
// RFC 8305). An address of this host itself beside others that are not is a look-alike (a
// bridge address every host has) and is not dialed; a group of this host's addresses only is on
// this machine (ranks told apart by COMM_HOST_ID) and is dialed. out[g][k] answers groups[g][k].
// Bounded by timeout_ms.
void probe_paths(const std::vector<std::vector<std::string>>& groups, int timeout_ms, int grace_ms,
                 std::vector<std::vector<ProbeResult>>* out);

// "EHOSTUNREACH" for the errors a dial names (connect()'s), "" for others.
std::string errno_name(int err);
// "connect(): No route to host (EHOSTUNREACH)", "no answer to the TCP handshake within 250 ms".
std::string probe_error_text(int err, int waited_ms);

// "10.77.0.1/24": a local address with its interface's prefix length (the bare address when
// no interface holds it).
std::string address_with_prefix(const std::string& address);

}  // namespace comm::posix

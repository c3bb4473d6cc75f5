// The init agreement: what comm_init's ranks agree on before any transport connects (world
// size, transport choice, timeout, tuning profile hash, ABI version, the plan's transports),
// the job secret, every rank's host, and the early listeners' address table (init_agreement.cc).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "communicator.h"
#include "rendezvous.h"
#include "status.h"
#include "store/store.h"
#include "transport.h"
#include "verdict_tree.h"

namespace comm {

struct Agreed {
  bool all_local = false;      // every rank on this host
  std::vector<int> host_of;    // every rank's host, numbered in order of each host's first rank
  std::vector<std::string> hosts;  // every rank's host address for comm_shrink ("" unknown)
  // This rank's early listener with every rank's address, when the table is usable (else null):
  // the transport whose registry entry listens early adopts it (connect.cc).
  std::shared_ptr<transport::EarlyListener> early;
  // Serves this rank's children in the verdict's tree; keep it until comm_init returns.
  std::unique_ptr<VerdictServer> tree_server;
};

// Every rank agrees, or every rank fails naming the difference (COMM_ERR_INVALID_USAGE), or
// none can have the forced transport (COMM_ERR_UNAVAILABLE). Bounded by s.timeout_ms.
// This process's host: ranks with the same one share a host (hostname, boot id, network
// namespace; or COMM_HOST_ID).
std::string host_identity();
// What every rank must agree on but the world size (a joiner's is the job's, not the grown
// communicator's), encoded; and the difference of two, naming both ranks ("" when equal).
std::string settings_fingerprint(const CommSettings& s);
std::string settings_difference(const std::string& mine, int my_rank, const std::string& theirs, int their_rank);

Status agree_at_init(Store& store, const Identity& id, const CommSettings& s, std::string* secret, Agreed* out);

}  // namespace comm

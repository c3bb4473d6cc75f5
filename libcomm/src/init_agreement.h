// The init agreement: what comm_init's ranks agree on before any transport connects (world
// size, transport choice, timeout, tuning profile hash, ABI version, the plan's transports),
// the job secret, every rank's host, and the early listeners' address table (init_agreement.cc).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "communicator.h"
#include "log.h"
#include "rendezvous.h"
#include "status.h"
#include "store/store.h"
#include "transport.h"
#include "verdict_tree.h"

namespace comm {

// How this rank takes part in the verdict's tree (verdict_tree.h), for the verdict and for the
// later rounds of the same comm_init that send one large value the same way (reachability.h).
struct InitTree {
  bool on = false;                  // off for stores that are not rank 0's server, for 2 ranks, under TLS
  VerdictServer* server = nullptr;  // this rank serves its children (null: it has none, or cannot listen)
  std::string my_host;              // host_identity(): whether the parent's address is on this host
  // The parent's "init/tree/<r>" entry once read; and whether to ask it at all: a parent that
  // failed once (gone, stalled, a route that drops packets) is not asked again.
  std::string parent_entry;
  bool ask_parent = true;
};

// One value rank 0 writes to the store, with its digest for the ranks that take it from their
// parent.
struct TreeValue {
  TreeItem item;
  const char* key;         // the value
  const char* digest_key;  // verdict_digest(value), written after it
  const char* what;        // for the INFO lines: "init verdict"
  uint32_t subsys;         // and their subsystem
};

// A rank other than 0 reads `v`: from its parent in the tree when it can, else (and for children
// of rank 0, which serves the store anyway) from the store; then serves it to its own children,
// whatever it says. A parent that fails costs one INFO line and the slice of timeout_ms it was
// given, never the read. Fails only when the store does not give the value (or, tree on, its
// digest) by `deadline`.
Status read_down_tree(Store& store, int rank, const TreeValue& v, int timeout_ms, InitTree* tree, Deadline deadline,
                      std::string* value);

struct Agreed {
  bool all_local = false;      // every rank on this host
  std::vector<int> host_of;    // every rank's host, numbered in order of each host's first rank
  std::vector<std::string> hosts;  // every rank's host address for comm_shrink ("" unknown)
  // This rank's early listener with every rank's address, when the table is usable (else null):
  // the transport whose registry entry listens early adopts it (connect.cc).
  std::shared_ptr<transport::EarlyListener> early;
  // Serves this rank's children in the verdict's tree; keep it until comm_init returns.
  std::unique_ptr<VerdictServer> tree_server;
  InitTree tree;  // its server is tree_server's; for the later rounds (reachability.h)
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

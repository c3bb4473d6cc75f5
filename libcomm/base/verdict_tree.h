// The init verdict down a binomial tree instead of n reads of rank 0's store (docs/design/base.md,
// "Hot keys"). Rank 0 writes the verdict once and a small digest key (SHA-256 and length); the
// parent of rank r is r with its lowest set bit cleared. A rank with children serves its copy
// of the verdict on a listener of its own while it is in comm_init; a child reads the digest
// and its parent's address from the store, asks its parent, checks the answer against the
// digest, and on any problem (parent gone, no answer within a slice of the timeout, a wrong
// answer) reads the store instead. Children of rank 0 read the store: it serves it anyway.
// Later rounds of the same comm_init send their one large value the same way (TreeItem): the
// reachability round's summary (libcomm/src/reachability.cc).
#pragma once

#include <memory>
#include <string>

#include "deadline.h"
#include "status.h"
#include "store/store.h"

namespace comm {

// r with its lowest set bit cleared (r > 0).
inline int tree_parent(int r) { return r & (r - 1); }
// Whether rank r (> 0) of `size` has a child: r + 1 < size and r is even (its lowest set bit
// is above bit 0, so r + 1 is a child).
inline bool tree_has_children(int r, int size) { return r > 0 && (r & 1) == 0 && r + 1 < size; }

// What a parent serves, each asked for by a tag of its own: the verdict, and the summary of the
// reachability round that follows it.
enum class TreeItem { kVerdict = 0, kReachSummary = 1 };

// The value of the digest key rank 0 writes beside an item: "<sha256 hex> <length>".
std::string verdict_digest(const std::string& verdict);

// A parent's server: a listener and a thread that answers each child's request for an item once
// this rank has that item (publish), until destroyed (the end of comm_init).
class VerdictServer {
 public:
  // Listens on `host` (numeric, of `family`: the caller's choice of interface for the guess,
  // every rank on this host or not, which tags the address) and starts the thread. `hook` is
  // COMM_TEST_INIT_TREE's action for this rank ("" none, "corrupt", "stall").
  static Status start(int rank, const std::string& host, int family, bool guess_local, const std::string& hook,
                      std::unique_ptr<VerdictServer>* out);
  ~VerdictServer();
  // "L|R<host:port>": tagged like the early listener's address, so a child on another host
  // does not dial a loopback address.
  const std::string& address() const;
  // This rank has the item: children waiting for it get it now.
  void publish(TreeItem item, const std::string& value);

  struct Impl;

 private:
  explicit VerdictServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A child: asks the parent at `tagged_addr` for the item whose digest key is `digest` within
// `deadline`; any failure is a status saying why (the caller reads the store then).
Status fetch_verdict(TreeItem item, const std::string& tagged_addr, bool same_host, const std::string& digest,
                     Deadline deadline, std::string* verdict);

}  // namespace comm

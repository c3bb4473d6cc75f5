// The set-up of a grown communicator (grow.cc, join.cc), or of a child of a grown or shrunk one
// (comm_dup after comm_grow: comm.cc, create_child), waits in the job store for ranks that
// may die meanwhile: a member killed while a joiner is admitted never publishes its address, a
// joiner killed after its answer never connects, and every other rank would wait COMM_TIMEOUT_MS
// for it. A SetupWatch ends those waits early (the transport's store is a watched one while it
// is set up, connect.cc): each check looks for evidence that a rank is gone, and the first rank
// that finds some tells the others through the job store, so all of them fail the grow within a
// second or two and its members undo it (docs/design/core.md, "Growing a communicator").
//
// Evidence: a member's connection to another member closed or its process gone (the parent
// communicator's transport, Transport::gone_peers: never a silence, not even the one that failed
// the parent, as a rank silent then may have taken part since; a stopped rank is left to the
// timeout), or a joiner's liveness
// counter in the job store that has not moved for 2 s (a joiner's thread bumps it every 200 ms
// from its answer until its set-up ends, whatever the set-up itself is busy with).
#pragma once

#include <memory>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "communicator.h"

namespace comm {

// A thread that adds 1 to `key` in `store` every `period` until it is destroyed: a process's
// liveness, for others to read while it waits (a joiner waiting for its answer, every 50 ms:
// grow.cc's claim admits only joiners whose counter it saw move, so the period delays every
// admission; a joiner in its set-up, every 200 ms: SetupWatch below).
class Bumper {
 public:
  Bumper(std::shared_ptr<Store> store, std::string key, std::chrono::milliseconds period);
  ~Bumper();
  Bumper(const Bumper&) = delete;
  Bumper& operator=(const Bumper&) = delete;

 private:
  std::shared_ptr<Store> store_;
  std::string key_;
  std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once the members above exist
};

class SetupWatch {
 public:
  // A member of `parent` (alive until end()) setting up communicator `id`, whose ranks are
  // `members` (ranks of the parent), then `joiners` joiners (comm_grow's).
  static std::shared_ptr<SetupWatch> for_member(comm_t parent, std::shared_ptr<Store> store, const std::string& id,
                                                std::vector<int> members, int joiners);
  // A joiner, rank `rank` of `grown_id`.
  static std::shared_ptr<SetupWatch> for_joiner(std::shared_ptr<Store> store, const std::string& grown_id, int rank);

  // OK while waiting still makes sense (and always after end()); else why not, naming the rank.
  Status check();
  // The set-up is over: checks pass from now on (the parent may go away), a joiner stops bumping.
  void end();

 private:
  SetupWatch(std::shared_ptr<Store> store, std::string grown_id) : store_(std::move(store)), id_(std::move(grown_id)) {}
  Status evidence();  // a member's or a joiner's own look
  Status told();      // another rank's finding, from the job store

  std::mutex mu_;
  std::shared_ptr<Store> store_;
  std::string id_;
  comm_t parent_ = nullptr;  // a member's: its connections
  std::vector<int> members_;  // a member's: the parent's ranks, in the new communicator's order
  int self_ = -1;  // a joiner's rank
  bool ended_ = false;
  std::unique_ptr<Bumper> bumper_;  // a joiner's
  struct Seen {
    int64_t value = -1;
    Clock::time_point since{};
  };
  std::vector<Seen> joiners_;  // a member's view of each joiner's counter
};

}  // namespace comm

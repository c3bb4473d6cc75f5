// The set-up watch of a grown communicator: setup_watch.h says what it looks for and why.
//
// Its keys, in the job store (un-prefixed, so a joiner, which knows no prefix yet, finds them):
//   job/join/alive/<grown id>/<rank>   the store's add: a joiner's liveness counter
//   job/join/abandoned/<grown id>      the store's add: > 0 once a rank gave the set-up up
//   job/join/abandoned/<grown id>/why  its reason, written before the count
#include "setup_watch.h"

#include <algorithm>

#include "log.h"
#include "watch.h"

namespace comm {
namespace {

// A joiner's thread bumps its counter this often; a member takes this much silence for death,
// the bound comm_grow already puts on a joiner between its ticket and its hello (grow.cc).
constexpr auto kBumpEvery = std::chrono::milliseconds(200);
constexpr auto kJoinerSilent = std::chrono::milliseconds(2000);

std::string alive_key(const std::string& id, int rank) { return "job/join/alive/" + id + "/" + std::to_string(rank); }
std::string abandoned_key(const std::string& id) { return "job/join/abandoned/" + id; }

}  // namespace

std::shared_ptr<SetupWatch> SetupWatch::for_member(comm_t parent, std::shared_ptr<Store> store, const std::string& id,
                                                   std::vector<int> members, int joiners) {
  std::shared_ptr<SetupWatch> w(new SetupWatch(std::move(store), id));
  w->parent_ = parent;
  w->members_ = std::move(members);
  w->joiners_.resize(static_cast<size_t>(std::max(0, joiners)));
  return w;
}

Bumper::Bumper(std::shared_ptr<Store> store, std::string key, std::chrono::milliseconds period)
    : store_(std::move(store)), key_(std::move(key)), period_(period), thread_([this] {
        std::unique_lock<std::mutex> lock(mu_);
        while (!stop_) {
          lock.unlock();
          int64_t ignored = 0;
          (void)store_->add(key_, 1, &ignored);  // a failing store fails the owner's own waits
          lock.lock();
          wake_.wait_for(lock, period_, [this] { return stop_; });
        }
      }) {}

Bumper::~Bumper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::shared_ptr<SetupWatch> SetupWatch::for_joiner(std::shared_ptr<Store> store, const std::string& grown_id, int rank) {
  std::shared_ptr<SetupWatch> w(new SetupWatch(std::move(store), grown_id));
  w->self_ = rank;
  w->bumper_ = std::make_unique<Bumper>(w->store_, alive_key(grown_id, rank), kBumpEvery);
  return w;
}

void SetupWatch::end() {
  std::unique_ptr<Bumper> bumper;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
    parent_ = nullptr;
    bumper = std::move(bumper_);
  }
  bumper.reset();  // joins its thread, outside the lock
}

Status SetupWatch::check() {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return Status::Ok();
  COMM_RETURN_IF_ERROR(told());
  Status st = evidence();
  if (st.ok()) return st;
  // Told to the others: their waits end at their next check, not at their timeout.
  int64_t ignored = 0;
  (void)store_->set(abandoned_key(id_) + "/why", st.message());
  (void)store_->add(abandoned_key(id_), 1, &ignored);
  COMM_WARN(kInit, "comm %s: set-up given up: %s", id_.c_str(), st.message().c_str());
  return st;
}

Status SetupWatch::told() {
  int64_t count = 0;
  if (!store_->add(abandoned_key(id_), 0, &count).ok() || count == 0) return Status::Ok();
  std::string why = "(no reason recorded)";
  (void)store_->get(abandoned_key(id_) + "/why", &why, Deadline::after_ms(1000));
  return RemoteError("comm " + id_ + ": another rank gave its set-up up: " + why);
}

Status SetupWatch::evidence() {
  if (self_ >= 0) return Status::Ok();  // a joiner knows only what the others tell it
  const Clock::time_point now = Clock::now();
  std::vector<int> closed;
  if (parent_->transport) {
    Driving driving(parent_);  // the parent's watcher looks at its transport only while nobody drives it
    parent_->transport->gone_peers(&closed);  // never a silence: a rank silent for a while may be here since
  }
  std::sort(closed.begin(), closed.end());  // the routed transport appends its parts' lists
  for (size_t i = 0; i < members_.size(); ++i) {
    const int p = members_[i];
    if (p == parent_->rank || !std::binary_search(closed.begin(), closed.end(), p)) continue;
    return RemoteError("comm " + id_ + ": rank " + std::to_string(i) + " (world rank " +
                       std::to_string(parent_->world_ranks[static_cast<size_t>(p)]) + ", rank " + std::to_string(p) +
                       " of comm " + parent_->id + ") closed its connections while this communicator was set up "
                       "(it died)");
  }
  for (size_t i = 0; i < joiners_.size(); ++i) {
    const int rank = static_cast<int>(members_.size() + i);
    int64_t value = 0;
    if (!store_->add(alive_key(id_, rank), 0, &value).ok()) continue;  // the store's own failure comes elsewhere
    Seen& seen = joiners_[i];
    if (value != seen.value) {
      seen = {value, now};
    } else if (now - seen.since >= kJoinerSilent) {
      return RemoteError("comm " + id_ + ": rank " + std::to_string(rank) + ", a joiner, gave no sign of life for " +
                         std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(kJoinerSilent).count()) +
                         " ms of its set-up (it died or is stopped)");
    }
  }
  return Status::Ok();
}

}  // namespace comm

// comm_agree_failed: after a failure, the ranks of a communicator that are still alive agree,
// without being told, on one set of failed ranks (ULFM's MPIX_Comm_agree over the failed group,
// MPIX_Comm_shrink's first half); comm_shrink(comm, NULL, COMM_SHRINK_AGREE, &out) then leaves
// them out. The protocol and what it assumes: docs/design/core.md, "Agreeing on the failed ranks".
//
// In short: each rank checks in at the job store with what it knows failed (its suspicions), and
// takes a ticket (the store's atomic add). Ticket 1 decides: it waits until every rank has checked
// in or is suspected by one that has (or the timeout passes), and publishes the verdict: the ranks
// that did not check in failed. The others wait for the verdict; a rank the verdict names failed
// (it checked in too late: stopped, cut off) is excluded for good. Only a strict majority of the
// communicator carries on, and a verdict that carries on binds a rank only once at least half of
// the communicator confirmed reading it. A decider that fails before its verdict costs its round:
// the others start the next round, whose decider is again ticket 1 there; should it wake and
// publish, too few confirm its verdict (they went on), and it is told it was excluded.
//
// comm_agree (ULFM's MPIX_Comm_agree with its flag) is the same agreement carrying each rank's
// flag, written before its ticket: the verdict also gives the AND of the kept ranks' flags, so
// that ranks which saw one operation end differently (an admission some completed and others
// failed: python/libcomm/fault_tolerance.py) take one decision.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <iterator>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "communicator.h"
#include "grow.h"
#include "log.h"
#include "rank_list.h"
#include "store/store.h"
#include "watch.h"

namespace comm {
namespace {

constexpr int kRounds = 3;
constexpr auto kPoll = std::chrono::milliseconds(20);  // the decider's look at the check-ins
constexpr int kWhoMs = 1000;  // a checked-in rank names its ticket right after taking it
// While a rank waits (the decider for the check-ins, the others for the verdict) it looks at its
// transport again this often and publishes what it newly suspects: a death its transport noticed
// only after the check-in (the FIN or reset arrived after the zero-timeout poll) still ends the
// decider's wait, instead of costing COMM_TIMEOUT_MS (docs/design/core.md, "Agreeing on the
// failed ranks").
constexpr auto kRefresh = std::chrono::milliseconds(100);
// A rank that read a verdict counts the others' confirmations (they read it the moment it is
// written) after 1 ms, then twice as long each time, up to this (await_confirmations). Not a
// blocking get on a key: on the TCP store a get that times out costs a new connection.
constexpr auto kConfirmPollMax = std::chrono::milliseconds(50);

// The flags the ranks agree on (comm_agree): the bitwise AND over the ranks the verdict keeps.
constexpr int kAllFlags = ~0;

// A set of ranks of this communicator from the store ("[1,3]", rank_list.h): another rank wrote
// it, so it is read strictly; sorted and without repeats, as the agreement compares sets.
Status parse_set(const std::string& text, int n, std::vector<int>* out) {
  COMM_RETURN_IF_ERROR(parse_rank_list(text, n, out));
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
  return Status::Ok();
}

// What this rank knows failed: the peers its transport saw gone, and the ranks its hang trace
// found stalled (a stopped rank is a suspicion until the verdict fences it). At the check-in and
// at each look again while the rank waits in the agreement, silence is judged only while the
// communicator's watcher still reads the heartbeats (neither broken nor aborted: watch.cc); once
// it stopped, a silence proves nothing past the transport's failure (transports/transport.h,
// closed_peers). Judged on closes only, the DDP wrapper's agreement, on a communicator that
// carries no calls, waited its whole timeout for a SIGSTOPped rank whose silence its watcher had
// seen (chaos run 4).
std::vector<int> own_suspicions(comm_t c) {
  std::vector<int> out;
  if (c->transport) {
    Driving driving(c);  // the watcher uses the transport only while no thread does
    const bool watched = !c->aborted.load(std::memory_order_acquire) && !c->is_broken.load(std::memory_order_acquire);
    if (watched)
      c->transport->lost_peers(&out);
    else
      c->transport->closed_peers(&out);
  }
  {
    std::lock_guard<std::mutex> lock(c->state_mu);
    out.insert(out.end(), c->stalled.begin(), c->stalled.end());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  out.erase(std::remove(out.begin(), out.end(), c->rank), out.end());
  return out;
}

// Adds what this rank suspects now to *mine; true if that added a rank.
bool refresh_suspicions(comm_t c, std::vector<int>* mine) {
  std::vector<int> now = own_suspicions(c), merged;
  std::set_union(mine->begin(), mine->end(), now.begin(), now.end(), std::back_inserter(merged));
  if (merged.size() == mine->size()) return false;
  *mine = std::move(merged);
  return true;
}

struct Verdict {
  bool quorum = false;
  std::vector<int> failed;  // quorum: the failed ranks; else the ranks that checked in
  int flag = kAllFlags;     // quorum: the AND of the kept ranks' flags
};

constexpr char kFlagMark[] = " flag ";  // "OK [2] flag 1": the verdict's flag after the set

// A checked-in rank's flag (written before its ticket, so it is there); one that cannot be read
// counts as 0, so a flag of "all went well" never passes on a doubt.
int read_flag(Store& store, int rank) {
  std::string text;
  if (!store.get("flag/" + std::to_string(rank), &text, Deadline::after_ms(kWhoMs)).ok()) return 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  return end != text.c_str() && *end == '\0' ? static_cast<int>(value) : 0;
}

// Ticket 1: reads the check-ins in ticket order until every rank is in or suspected by a rank
// that is, or the timeout passes; the rest failed. A checked-in rank may widen its suspicions
// while it waits (refresh_suspicions), so the check-ins are read again every kRefresh, and so are
// the decider's own.
Status decide(comm_t c, Store& store, int my_flag, std::vector<int>* mine, std::string* verdict) {
  const int n = c->size;
  int flag = my_flag;  // the AND over the ranks checked in (each wrote its flag before its ticket)
  std::vector<bool> in(static_cast<size_t>(n), false), suspected(static_cast<size_t>(n), false);
  in[static_cast<size_t>(c->rank)] = true;
  const Deadline deadline = Deadline::after_ms(c->settings.timeout_ms);
  int64_t next = 2;
  std::vector<int> checked_in;  // the others, in ticket order
  auto read_in = [&](int r) {
    std::string theirs;
    std::vector<int> named;  // a malformed check-in names no one (parse_set refuses it whole)
    if (store.get("in/" + std::to_string(r), &theirs, Deadline::after_ms(kWhoMs)).ok() &&
        parse_set(theirs, n, &named).ok())
      for (int s : named) suspected[static_cast<size_t>(s)] = true;
  };
  Clock::time_point next_refresh = Clock::now() + kRefresh;
  for (;;) {
    // After the deadline, one last look: a decider delayed past it (stopped, descheduled) judges
    // the check-ins as they are when it goes on, not as a reply read before its delay showed them.
    const bool last_look = deadline.expired();
    for (int r : *mine) suspected[static_cast<size_t>(r)] = true;
    int64_t tickets = 0;
    COMM_RETURN_IF_ERROR(store.add("tickets", 0, &tickets));
    for (; next <= tickets; ++next) {
      std::string who;
      if (!store.get("who/" + std::to_string(next), &who, Deadline::after_ms(kWhoMs)).ok()) continue;  // died there
      std::vector<int> r;  // one rank ("5"): a list of one
      if (!parse_set(who, n, &r).ok() || r.size() != 1 || in[static_cast<size_t>(r[0])]) continue;
      in[static_cast<size_t>(r[0])] = true;
      flag &= read_flag(store, r[0]);
      checked_in.push_back(r[0]);
      read_in(r[0]);
    }
    bool accounted = true;
    for (int r = 0; r < n; ++r) accounted = accounted && (in[static_cast<size_t>(r)] || suspected[static_cast<size_t>(r)]);
    if (accounted || last_look) break;
    std::this_thread::sleep_for(kPoll);
    if (Clock::now() >= next_refresh) {
      next_refresh = Clock::now() + kRefresh;
      if (refresh_suspicions(c, mine))
        COMM_INFO(kInit, "comm %s rank %d: comm_agree_failed: the decider now suspects %s", c->id.c_str(), c->rank,
                  rank_list_bracketed(*mine).c_str());
      for (int r : checked_in) read_in(r);
    }
  }
  std::vector<int> alive, failed;
  for (int r = 0; r < n; ++r) (in[static_cast<size_t>(r)] ? alive : failed).push_back(r);
  const bool quorum = 2 * alive.size() > static_cast<size_t>(n);
  *verdict = quorum ? "OK " + rank_list_bracketed(failed) + kFlagMark + std::to_string(flag)
                    : "NOQUORUM " + rank_list_bracketed(alive);
  // For the launcher (comm-run --replace-failed), before the verdict: it replaces the excluded.
  if (quorum && !failed.empty()) (void)grow::record_exclusions(c, failed);  // logged; the verdict stands
  return store.set("verdict", *verdict);
}

// While a rank that is not the decider waits for the verdict: every kRefresh it asks its
// transport again and, when it suspects more, rewrites its check-in (the decider reads them again).
// The waiting thread does not use the transport meanwhile; a failed write only loses a refresh.
class Refresher {
 public:
  Refresher(comm_t c, Store& store, std::vector<int>* mine, int round)
      : thread_([this, c, &store, mine, round] {
          std::unique_lock<std::mutex> lock(mu_);
          while (!cv_.wait_for(lock, kRefresh, [this] { return stop_; })) {
            lock.unlock();
            if (refresh_suspicions(c, mine)) {
              COMM_INFO(kInit, "comm %s rank %d: comm_agree_failed round %d: now suspects %s", c->id.c_str(), c->rank,
                        round, rank_list_bracketed(*mine).c_str());
              (void)store.set("in/" + std::to_string(c->rank), rank_list_bracketed(*mine),
                              Deadline::after_ms(kWhoMs));
            }
            lock.lock();
          }
        }) {}
  ~Refresher() { stop(); }
  Refresher(const Refresher&) = delete;
  Refresher& operator=(const Refresher&) = delete;
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once the members above exist
};

// "OK [failed] flag F" or "NOQUORUM [checked in]", as decide() writes it.
Status parse_verdict(const std::string& text, int n, Verdict* v) {
  const std::string ok = "OK ", no_quorum = "NOQUORUM ";
  v->quorum = text.rfind(ok, 0) == 0;
  if (!v->quorum && text.rfind(no_quorum, 0) != 0)
    return InvalidArgument("malformed verdict \"" + text + "\": it starts with neither \"OK \" nor \"NOQUORUM \"");
  if (!v->quorum) return parse_set(text.substr(no_quorum.size()), n, &v->failed);
  const size_t mark = text.find(kFlagMark);
  if (mark == std::string::npos) return InvalidArgument("malformed verdict \"" + text + "\": no flag");
  const std::string flag = text.substr(mark + sizeof(kFlagMark) - 1);
  char* end = nullptr;
  v->flag = static_cast<int>(std::strtol(flag.c_str(), &end, 10));
  if (flag.empty() || *end != '\0') return InvalidArgument("malformed verdict \"" + text + "\": bad flag");
  return parse_set(text.substr(ok.size(), mark - ok.size()), n, &v->failed);
}

// A verdict that carries on binds this rank only once at least half of the communicator stands
// behind it: each rank that reads it adds itself to `confirmed`, and a rank that timed out on the
// verdict and went on to a later round never does. A later round's quorum needs a strict majority
// of check-ins from ranks that did not confirm, so it and this verdict cannot both carry on. Without
// this, a decider stopped past the others' verdict wait woke, published the round's verdict and
// went on alone with it (docs/design/core.md, "Agreeing on the failed ranks"). Ends at once when
// so many ranks went on (*went_on) that half can no longer confirm, else after `deadline`.
Status await_confirmations(comm_t c, Store& round_store, const std::string& next_round, Deadline deadline,
                           int* confirmed, int* went_on) {
  const int n = c->size;
  std::shared_ptr<Store> next = make_prefix_store(c->job_store, next_round);
  const int64_t half = (n + 1) / 2;
  int64_t count = 0, gone = 0;
  auto pause = std::chrono::milliseconds(1);
  COMM_RETURN_IF_ERROR(round_store.add("confirmed", 1, &count));
  while (count < half) {
    COMM_RETURN_IF_ERROR(next->add("tickets", 0, &gone));
    if (n - gone < half || deadline.expired()) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(2 * pause, kConfirmPollMax);
    COMM_RETURN_IF_ERROR(round_store.add("confirmed", 0, &count));
  }
  *confirmed = static_cast<int>(count);
  *went_on = static_cast<int>(gone);
  return Status::Ok();
}

}  // namespace

Status agree_failed(comm_t c, std::vector<int>* failed, int* flag) {
  const char* call = flag ? "comm_agree" : "comm_agree_failed";
  const std::string where = "rank " + std::to_string(c->rank) + ", comm " + c->id + ": " + call + ": ";
  failed->clear();
  if (c->shrunk)
    return InvalidUsage(where + "comm_shrink was already called on this communicator; agree on the one it made");
  if (c->size == 1) return Status::Ok();
  // comm_agree_failed takes part with flag 0: should a rank call it where the others call
  // comm_agree (one that failed what they completed), their AND is 0, the safe answer ("undo").
  const int my_flag = flag ? *flag : 0;
  const int n = c->size;
  const std::string base = "comm/" + c->id + "/agree" + std::to_string(++c->agreements);
  std::vector<int> mine = own_suspicions(c);  // widened while this rank waits (refresh_suspicions)
  const int timeout_ms = c->settings.timeout_ms;
  const bool serves_store = c->job_store->dies_with_rank0() &&
                            (c->world_ranks.empty() ? c->rank == 0 : c->world_ranks[static_cast<size_t>(c->rank)] == 0);
  // The decider waits up to one timeout for the check-ins; the others a half more for its verdict.
  const int verdict_ms = timeout_ms + timeout_ms / 2 + 2 * kWhoMs;
  auto unreachable = [&](const Status& st) {
    return Unavailable(where + "the job store does not answer (" + st.message() + "); its server, world rank 0, "
                       "may be the rank that failed: the agreement needs a store that outlives the failure "
                       "(comm-run --replace-failed, COMM_STORE_EXTERNAL=1 with a store served outside the ranks, "
                       "init_method file://, or world rank 0 alive); comm_shrink with an explicit list works "
                       "without it");
  };
  for (int round = 0; round < kRounds; ++round) {
    std::shared_ptr<Store> store = make_prefix_store(c->job_store, base + "/r" + std::to_string(round));
    Status st = store->set("flag/" + std::to_string(c->rank), std::to_string(my_flag), Deadline::after_ms(timeout_ms));
    if (st.ok())
      st = store->set("in/" + std::to_string(c->rank), rank_list_bracketed(mine), Deadline::after_ms(timeout_ms));
    int64_t ticket = 0;
    if (st.ok()) st = store->add("tickets", 1, &ticket);
    if (st.ok()) st = store->set("who/" + std::to_string(ticket), std::to_string(c->rank), Deadline::after_ms(timeout_ms));
    if (!st.ok()) return unreachable(st);
    std::string text;
    if (ticket == 1) {
      COMM_INFO(kInit, "comm %s rank %d: comm_agree_failed decides round %d (its suspicions: %s)", c->id.c_str(),
                c->rank, round, rank_list_bracketed(mine).c_str());
      st = decide(c, *store, my_flag, &mine, &text);
      if (!st.ok()) return unreachable(st);
    } else {
      // Blocks on the verdict as before (it comes the moment the decider writes it, also from a
      // decider whose store goes with it right after); meanwhile a second thread publishes a
      // death this rank's transport notices after the check-in, for the decider, which may be
      // waiting for that rank.
      Refresher refresher(c, *store, &mine, round);
      st = store->get("verdict", &text, Deadline::after_ms(verdict_ms));
      refresher.stop();
      if (!st.ok()) {
        if (st.code() != COMM_ERR_TIMEOUT) return unreachable(st);
        COMM_WARN(kInit, "%sround %d's decider published no verdict within %d ms (did it fail during the agreement?); "
                  "next round", where.c_str(), round, verdict_ms);
        continue;
      }
    }
    Verdict v;
    st = parse_verdict(text, n, &v);
    if (!st.ok())
      return RemoteError(where + "round " + std::to_string(round) + "'s decider published a verdict this rank cannot "
                         "read (" + st.message() + "); do all ranks run the same libcomm?");
    COMM_INFO(kInit, "comm %s rank %d: comm_agree_failed round %d: %s", c->id.c_str(), c->rank, round, text.c_str());
    const bool me_failed = v.quorum ? std::binary_search(v.failed.begin(), v.failed.end(), c->rank)
                                    : !std::binary_search(v.failed.begin(), v.failed.end(), c->rank);
    if (me_failed)
      return RemoteError(where + "the other ranks agreed that this rank failed (it joined the agreement after their "
                         "verdict " + text + ": was it stopped, or cut off?); it is excluded from this "
                         "communicator for good and cannot rejoin it: exit (a launcher may start a new process)");
    if (!v.quorum) {
      // This side stops, and its processes may exit next. World rank 0's process serves the TCP
      // store: leaving at once, it would take the verdict with it before a slower rank that
      // checked in has read it (that rank would be told "the job store does not answer" instead
      // of why). So the others confirm they read it, and the server waits for them, bounded
      // (docs/design/core.md, "Agreeing on the failed ranks").
      if (!serves_store) {
        (void)confirm_read(*store, "verdict", c->rank);
      } else {
        std::vector<int> readers;
        for (int r : v.failed)
          if (r != c->rank) readers.push_back(r);
        (void)wait_read_by(*store, "verdict", readers, Deadline::after_ms(timeout_ms));
      }
      return RemoteError(where + "only ranks " + rank_list_bracketed(v.failed) + " of " + std::to_string(n) + " joined the "
                         "agreement, not a majority: this side stops, so that two sides of a split job never "
                         "both go on");
    }
    int confirmed = 0, went_on = 0;
    st = await_confirmations(c, *store, base + "/r" + std::to_string(round + 1), Deadline::after_ms(verdict_ms),
                             &confirmed, &went_on);
    if (!st.ok()) return unreachable(st);
    const std::string short_of = where + "round " + std::to_string(round) + "'s verdict " + text + " was confirmed by " +
                                 std::to_string(confirmed) + " of " + std::to_string(n) + " ranks, fewer than half: ";
    if (2 * confirmed < n && went_on > 0)
      return RemoteError(short_of + std::to_string(went_on) + " went on to a later round without this rank (was it "
                         "stopped, or cut off?); it is excluded from this communicator for good and cannot rejoin "
                         "it: exit (a launcher may start a new process)");
    if (2 * confirmed < n)
      return RemoteError(short_of + "ranks that checked in died before they read it, so fewer than half stand behind "
                         "it, not a majority: this side stops, so that two sides of a split job never both go on");
    *failed = v.failed;
    if (flag) *flag = v.flag;
    return Status::Ok();
  }
  return Timeout(where + "no decider published a verdict in " + std::to_string(kRounds) + " rounds of " +
                 std::to_string(verdict_ms) + " ms; are the other ranks failing one after another?");
}

}  // namespace comm

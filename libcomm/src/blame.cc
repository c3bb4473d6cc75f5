// Following a hang along the ranks' waits to the rank at the end (blame.h).
//
// Why the store: when one rank stops, its neighbours time out waiting on it, and the ranks
// waiting on those neighbours time out too, at about the same moment. The first rank to time
// out used to tell everyone "rank 0 waited on rank 1", and every rank failed with that, even
// when rank 1 was itself waiting on the stopped rank 3. Only the ranks together know the
// chain: each publishes its own wait, then reads the others'. Live ranks publish within
// milliseconds (the first timeout is reported to them over the transport, and that ends their
// wait too); the stalled rank never does.
#include "blame.h"

#include <algorithm>
#include <deque>
#include <map>
#include <sstream>
#include <thread>

#include "log.h"

namespace comm {
namespace {

using Awaited = transport::Transport::Awaited;

// How long a rank is given to publish its wait. Live ranks on the chain are in a wait, which
// the first rank's report ends within milliseconds (a socket's ERROR frame, shared memory's
// doorbell), so this bounds the extra time a hang costs more than it waits for them.
constexpr int kMinGraceMs = 250;
constexpr int kMaxGraceMs = 2000;
constexpr int kSliceMs = 100;  // a store read at a time, so that comm_abort ends the walk

std::string key_of(int rank) { return "waits/" + std::to_string(rank); }

// One line per peer waited on: "peer seq coll dtype op root count".
std::string encode(const std::vector<Awaited>& waits) {
  std::string out = "v1\n";
  for (const Awaited& a : waits)
    out += std::to_string(a.peer) + " " + std::to_string(a.tag.seq) + " " + std::to_string(int(a.tag.coll)) + " " +
           std::to_string(int(a.tag.dtype)) + " " + std::to_string(int(a.tag.op)) + " " +
           std::to_string(a.tag.root) + " " + std::to_string(a.tag.count) + "\n";
  return out;
}

// A malformed entry reads as "waits on nobody": it still shows that its rank is alive.
std::vector<Awaited> decode(const std::string& text, int size) {
  std::vector<Awaited> waits;
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != "v1") return waits;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    Awaited a;
    int coll = 0, dtype = 0, op = 0;
    if (!(f >> a.peer >> a.tag.seq >> coll >> dtype >> op >> a.tag.root >> a.tag.count)) continue;
    if (a.peer < 0 || a.peer >= size) continue;
    a.tag.coll = static_cast<transport::CollKind>(coll);
    a.tag.dtype = static_cast<uint8_t>(dtype);
    a.tag.op = static_cast<uint8_t>(op);
    waits.push_back(a);
  }
  return waits;
}

struct Node {
  bool reported = false;
  std::vector<Awaited> waits;
  int parent = -1;  // the rank whose wait led here first
};

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i)
    s += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  return s;
}

// Another rank found q silent (below): its transport reaches q where this one's does not (a
// shared-memory neighbour keeps no heartbeat clock while it waits, a socket peer does).
std::string unheard_key(int rank) { return "unheard/" + std::to_string(rank); }

// Reads rank q's entry, retrying in slices until the grace ends (one try after it) or another
// rank says q is silent (*unheard_elsewhere). False when q published nothing; *store_error says
// why the store failed otherwise.
bool read_entry(comm_t c, Store& store, int q, Clock::time_point grace_end, std::string* text,
                std::string* store_error, bool* unheard_elsewhere) {
  for (;;) {
    Status st = store.get(key_of(q), text, Deadline::after_ms(kSliceMs));
    if (st.ok()) return true;
    if (st.code() != COMM_ERR_TIMEOUT) {
      *store_error = st.message();
      return false;
    }
    int64_t silent_for = 0;
    if (store.add(unheard_key(q), 0, &silent_for).ok() && silent_for > 0) {
      *unheard_elsewhere = true;
      return false;
    }
    if (Clock::now() >= grace_end || c->aborted.load(std::memory_order_acquire)) return false;
  }
}

}  // namespace

Status trace_hang(comm_t c, const Status& failure) {
  if (!c->transport || !c->job_store || c->size < 3) return failure;  // two ranks: the peer is the answer
  const transport::Transport::WaitFailure& wf = c->transport->wait_failure();
  if (!wf.hang) return failure;
  const int grace_ms = std::clamp(c->settings.timeout_ms / 4, kMinGraceMs, kMaxGraceMs);
  const Clock::time_point grace_end = Clock::now() + std::chrono::milliseconds(grace_ms);
  std::shared_ptr<Store> store = make_prefix_store(c->job_store, "comm/" + c->id + "/hang");
  const std::string saw = ". What rank " + std::to_string(c->rank) + " saw: " + failure.message();

  // Publish first: the ranks waiting on us read it. A store that does not take it within the
  // grace is itself the answer: rank 0 of the job serves it, in its own process.
  Status st = store->set(key_of(c->rank), encode(wf.awaited), Deadline(grace_end));
  if (!st.ok()) {
    int zero = -1;
    for (int r = 0; r < c->size; ++r)
      if (c->world_ranks.empty() ? r == 0 : c->world_ranks[static_cast<size_t>(r)] == 0) zero = r;
    if (st.code() == COMM_ERR_TIMEOUT && zero >= 0 && zero != c->rank)
      return Status(failure.code(), "rank " + std::to_string(zero) +
                                        " is stalled: the job store it serves did not answer for " +
                                        std::to_string(grace_ms) + " ms (is that process stopped or hung?)" + saw);
    COMM_INFO(kColl, "rank %d: could not publish its wait to trace the hang: %s", c->rank, st.message().c_str());
    return failure;
  }
  int64_t ignored = 0;
  (void)store->add("reported", 1, &ignored);
  // Rank 0 of the job serves the store in its process, which may exit once this call returns:
  // it stays until every rank that reported has finished reading (or another grace passes).
  // A rank that concludes at once (the stalled rank silent) must still wait for the ones that
  // have not published yet (a rank that timed out first sends its report before it publishes):
  // until the grace ends, or every rank but the stalled ones has reported.
  struct StayForReaders {
    comm_t c;
    Store& store;
    int grace_ms;
    Clock::time_point hold_until;
    int64_t expected = 0;  // set after the walk: the ranks that are not stalled
    ~StayForReaders() {
      int64_t traced = 0, reported = 0;
      (void)store.add("traced", 1, &traced);
      // Only a store that dies with it: a file:// or external store outlives rank 0, which then
      // need not stay (it held every rank's agreement after a SIGSTOP in the 4x2 chaos runs for its
      // 2 s hold, waiting for reports from ranks that learn of the hang by a report and never trace).
      const bool serves = c->job_store->dies_with_rank0() &&
                          (c->world_ranks.empty() ? c->rank == 0 : c->world_ranks[static_cast<size_t>(c->rank)] == 0);
      if (!serves) return;
      const Deadline stay = Deadline::after_ms(grace_ms);
      while (!stay.expired() && !c->aborted.load(std::memory_order_acquire) &&
             store.add("traced", 0, &traced).ok() && store.add("reported", 0, &reported).ok() &&
             (traced < reported || (Clock::now() < hold_until && reported < expected)))
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } stay{c, *store, grace_ms, grace_end};
  if (wf.awaited.empty()) return failure;

  // Breadth first from our own peers; every rank once.
  std::map<int, Node> nodes;
  nodes[c->rank] = Node{true, wf.awaited, -1};
  std::deque<int> todo;
  for (const Awaited& a : wf.awaited) {
    if (nodes.count(a.peer) == 0) nodes[a.peer].parent = c->rank;
    todo.push_back(a.peer);
  }
  std::string store_error, unheard;
  // A rank this one has heard nothing from, not even a heartbeat, for this long is stalled: a live
  // one, also one that waits, is heard every COMM_HEARTBEAT_MS. It is not waited for (the grace
  // cost every SIGSTOP 2 s more than its timeout: issue 35's bound is the timeout plus 3 s).
  const int64_t hb_ms = c->settings.heartbeat_ms;
  const int64_t silent_enough_ms = hb_ms > 0 ? std::max<int64_t>(3 * hb_ms, 1000) : -1;
  while (!todo.empty()) {
    const int q = todo.front();
    todo.pop_front();
    Node& n = nodes[q];
    if (n.reported || q == c->rank) continue;
    const int64_t quiet = silent_enough_ms > 0 ? c->transport->silent_ms(q) : -1;
    if (quiet >= silent_enough_ms && silent_enough_ms > 0) {
      unheard += "; rank " + std::to_string(q) + " sent this rank nothing, not even a heartbeat, for " +
                 std::to_string(quiet) + " ms, so it was not waited for";
      int64_t ignored = 0;
      (void)store->add(unheard_key(q), 1, &ignored);  // the ranks that cannot tell stop waiting for it too
      continue;
    }
    std::string text;
    bool unheard_elsewhere = false;
    if (!store_error.empty() || !read_entry(c, *store, q, grace_end, &text, &store_error, &unheard_elsewhere)) {
      if (unheard_elsewhere)
        unheard += "; another rank heard nothing from rank " + std::to_string(q) + ", not even a heartbeat, so it "
                   "was not waited for";
      continue;
    }
    n.reported = true;
    n.waits = decode(text, c->size);
    for (const Awaited& a : n.waits) {
      if (nodes.count(a.peer) == 0) {
        nodes[a.peer].parent = q;
        todo.push_back(a.peer);
      }
    }
  }
  if (!store_error.empty()) {
    COMM_INFO(kColl, "rank %d: the store failed while tracing the hang: %s", c->rank, store_error.c_str());
    return failure;
  }

  std::vector<int> stalled, waiting;
  for (const auto& [r, n] : nodes) (n.reported ? waiting : stalled).push_back(r);
  stay.expected = c->size - static_cast<int64_t>(stalled.size());
  {
    std::lock_guard<std::mutex> lock(c->state_mu);  // comm_agree_failed's suspicions (agree.cc)
    c->stalled = stalled;
  }
  // The chain: each stalled rank's path back to us, as "a waited on b" from our end.
  std::vector<std::pair<int, int>> edges;
  for (int s : stalled) {
    std::vector<std::pair<int, int>> path;
    for (int r = s; nodes[r].parent >= 0; r = nodes[r].parent) path.push_back({nodes[r].parent, r});
    std::reverse(path.begin(), path.end());
    for (const auto& e : path)
      if (std::find(edges.begin(), edges.end(), e) == edges.end()) edges.push_back(e);
  }
  std::string chain;
  for (const auto& [a, b] : edges)
    chain += (chain.empty() ? "" : ", ") + std::string("rank ") + std::to_string(a) + " waited on rank " + std::to_string(b);
  const std::string op = transport::describe(wf.awaited.front().tag);
  std::string verdict;
  if (stalled.empty()) {
    // Every rank on the chain reported: they wait on each other.
    for (const auto& [r, n] : nodes)
      for (const Awaited& a : n.waits)
        chain += (chain.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " waited on rank " +
                 std::to_string(a.peer) + " (" + transport::describe(a.tag) + ")";
    verdict = "no rank on the chain of waits is stalled by itself: " + chain +
              " (a cycle: do the ranks call the same operations in the same order?)";
  } else {
    verdict = rank_list(stalled) + (stalled.size() == 1 ? " is" : " are") + " stalled: " + chain + "; " +
              rank_list(waiting) + " reported waiting in " + op + ", " + rank_list(stalled) + " did not report within " +
              std::to_string(grace_ms) + " ms (stopped, hung outside libcomm, or not calling this operation?)" + unheard;
  }
  COMM_INFO(kColl, "rank %d: %s", c->rank, verdict.c_str());
  return Status(failure.code(), verdict + saw);
}

}  // namespace comm

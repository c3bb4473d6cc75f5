// comm_grow, the members' side (NCCL 2.29's ncclCommGrow): the lowest member claims joiners
// from the job's join queue (grow.h: the keys), reads what each says about itself, and tells
// the other members through one small broadcast on the communicator; with joiners, the members
// learn each other's hosts, the lowest answers each joiner with what a member of the grown
// communicator needs, and members and joiners connect it together, as comm_dup's children do.
// The protocol and what it assumes: docs/design/core.md, "Growing a communicator".
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "grow.h"
#include "init_agreement.h"
#include "log.h"
#include "setup_watch.h"

namespace comm::grow {
namespace {

// A joiner takes its ticket, then writes its hello at once: with COMM_GROW_WAITING, a ticket
// without a hello this long after is a joiner that died in between (it gets RETRY if not). As
// long again without its liveness counter moving (join.cc bumps it every 200 ms) is a joiner
// that died while it waited.
constexpr int kHelloMs = 2000;

enum class Waiting { kAlive, kGone, kUndecided };

// With COMM_GROW_WAITING the lowest member claims only joiners it saw alive: a ticket's counter
// moved between two of its grows (a step apart). Else a joiner killed while it waited was
// admitted, its set-up failed, and the exclusion recorded for its slot's generation was taken by
// the launcher for the replacement it had started meanwhile, which it killed: each grow then
// admitted the previous, killed, joiner (a chaos run's cascade). A counter that stood still for
// kHelloMs is a dead joiner: its ticket is withdrawn.
Waiting look_at(comm_t c, Store& store, int64_t t) {
  if (withdrawn(store, t)) return Waiting::kGone;
  int64_t value = 0;
  if (!store.add(alive_key(t), 0, &value).ok()) return Waiting::kUndecided;
  const Clock::time_point now = Clock::now();
  auto [it, first] = c->joiners_seen.try_emplace(t, value, now);
  if (first) return Waiting::kUndecided;
  if (it->second.first != value) return Waiting::kAlive;
  if (now - it->second.second < std::chrono::milliseconds(kHelloMs)) return Waiting::kUndecided;
  withdraw(store, t);
  COMM_INFO(kInit, "rank %d, comm %s: comm_grow: the joiner of ticket %lld gave no sign of life for %d ms while it "
            "waited: withdrawn", c->rank, c->id.c_str(), static_cast<long long>(t), kHelloMs);
  return Waiting::kGone;
}

enum Kind : int64_t { kNone = 0, kGrow = 1, kFail = 2 };

struct Joiner {
  int64_t ticket = 0;
  Hello hello;
};

std::string joiner_name(const Joiner& j) {
  return "the joiner of ticket " + std::to_string(j.ticket) + (j.hello.slot >= 0 ? " (slot " + std::to_string(j.hello.slot) + ")" : "");
}

// The lowest member: claims tickets, reads their hellos, and answers the ones it cannot admit.
// Returns the joiners to admit; a failure the members share is a Status (the joiners it claimed
// were told RETRY, so they wait for the next grow).
Status claim(comm_t c, int n_join, std::vector<Joiner>* admitted) {
  Store& store = *c->job_store;
  int64_t first = 0, last = 0;
  if (n_join == COMM_GROW_WAITING) {
    int64_t tickets = 0, claimed = 0;
    COMM_RETURN_IF_ERROR(store.add(kTickets, 0, &tickets));
    // The every-step case, nobody waits: the count claimed only grows, so the last one seen says so.
    if (tickets <= c->joins_claimed_seen) return Status::Ok();
    COMM_RETURN_IF_ERROR(store.add(kClaimed, 0, &claimed));
    c->joins_claimed_seen = claimed;
    if (tickets <= claimed) return Status::Ok();
    std::vector<Waiting> waiting;  // every one looked at now, so that joiners who came together join together
    for (int64_t t = claimed + 1; t <= tickets; ++t) waiting.push_back(look_at(c, store, t));
    int64_t upto = claimed;  // the tickets in order that are alive or gone: the rest wait for a later look
    while (upto < tickets && waiting[static_cast<size_t>(upto - claimed)] != Waiting::kUndecided) ++upto;
    if (upto == claimed) return Status::Ok();
    c->joiners_seen.erase(c->joiners_seen.begin(), c->joiners_seen.upper_bound(upto));
    COMM_RETURN_IF_ERROR(store.add(kClaimed, upto - claimed, &last));
    first = last - (upto - claimed) + 1;  // another communicator's grow may have claimed some meanwhile
  } else {
    COMM_RETURN_IF_ERROR(store.add(kClaimed, n_join, &last));
    first = last - n_join + 1;
  }
  c->joins_claimed_seen = last;
  const std::string mine = settings_fingerprint(c->settings);
  const Deadline all = Deadline::after_ms(c->settings.timeout_ms);
  std::string problems;
  std::vector<int64_t> missing;
  for (int64_t t = first; t <= last; ++t) {
    Joiner j;
    j.ticket = t;
    std::string text;
    const Deadline d = n_join == COMM_GROW_WAITING ? Deadline::after_ms(kHelloMs) : all;
    if (!store.get(hello_key(t), &text, d).ok()) {
      missing.push_back(t);
      continue;
    }
    if (!decode_hello(text, &j.hello)) {
      (void)store.set(answer_key(t), "FAIL\nits hello in the job store is malformed (a libcomm of another version? "
                                     "start every process with the same libcomm)");
      problems += (problems.empty() ? "" : "; ") + joiner_name(j) + " sent a malformed hello";
      continue;
    }
    if (withdrawn(store, t)) continue;  // gave up waiting: it is gone
    const int new_rank = c->size + static_cast<int>(admitted->size());
    const std::string diff = settings_difference(mine, 0, j.hello.settings, new_rank);
    if (!diff.empty()) {
      (void)store.set(answer_key(t), "FAIL\nits settings differ from the job's: " + diff +
                                         "; start a joiner with the job's environment plus COMM_JOIN=1");
      problems += (problems.empty() ? "" : "; ") + joiner_name(j) + ": " + diff;
      continue;
    }
    admitted->push_back(j);
  }
  if (n_join == COMM_GROW_WAITING) {
    for (int64_t t : missing) (void)store.set(answer_key(t), kRetry);  // alive after all: it registers again
    if (!problems.empty())
      COMM_WARN(kInit, "rank %d, comm %s: comm_grow: not admitted: %s", c->rank, c->id.c_str(), problems.c_str());
    return Status::Ok();
  }
  if (static_cast<int>(admitted->size()) == n_join) return Status::Ok();  // (a joiner that gave up is not one)
  // Exactly n_join or nothing: the ones that came wait for the next grow, as do late ones.
  for (const Joiner& j : *admitted) (void)store.set(answer_key(j.ticket), kRetry);
  for (int64_t t : missing) (void)store.set(answer_key(t), kRetry);
  const int came = static_cast<int>(admitted->size());
  admitted->clear();
  if (!problems.empty())
    return InvalidUsage("not every joiner can join: " + problems + "; nothing changed");
  return Timeout(std::to_string(came) + " of the " + std::to_string(n_join) + " joiners asked for registered within " +
                 std::to_string(c->settings.timeout_ms) + " ms (are they started with the job's environment plus "
                 "COMM_JOIN=1, and do they reach the job's store?); nothing changed");
}

// The lowest member's decision, for the broadcast: each joiner's world rank, host and address,
// and the grown communicator's secret.
Status describe(comm_t c, std::vector<Joiner>& joiners, std::string* payload) {
  Store& store = *c->job_store;
  std::set<int> used(c->world_ranks.begin(), c->world_ranks.end());
  int fresh = std::max(static_cast<int>(c->world_addrs ? c->world_addrs->size() : 0), *used.rbegin() + 1);
  std::string secret;
  COMM_RETURN_IF_ERROR(random_secret(&secret));
  *payload = secret + "\n";
  for (Joiner& j : joiners) {
    // Its launcher slot when that is free (a replacement takes the slot of the rank it replaces);
    // never 0 while a TCP store may be served there (world rank 0 means "serves the store").
    int w = j.hello.slot;
    if (w < 0 || used.count(w) > 0 || (w == 0 && c->job_store->dies_with_rank0())) w = fresh++;
    fresh = std::max(fresh, w + 1);
    used.insert(w);
    int64_t gen = 0;
    COMM_RETURN_IF_ERROR(store.add(joins_key(w), 1, &gen));
    DecidedJoiner d;
    d.world = w;
    d.gen = static_cast<int>(gen);
    d.host = j.hello.host;
    d.reach = j.hello.reach;
    *payload += encode_decided(d) + "\n";
  }
  return Status::Ok();
}

Status broadcast(comm_t c, void* buf, size_t bytes) {
  algo::CollArgs args;
  args.kind = transport::CollKind::kBroadcast;
  args.sendbuf = buf;
  args.recvbuf = buf;
  args.count = bytes;
  args.dtype = COMM_UINT8;
  args.root = 0;
  return run_blocking(c, args);
}

// Every member: the grown communicator's fields from the decision (all alike).
Status plan(comm_t c, const std::string& payload, const std::vector<uint64_t>& member_hosts, Answer* a,
            std::vector<std::string>* reach) {
  std::vector<std::string> lines;
  size_t pos = 0;
  for (size_t nl; (nl = payload.find('\n', pos)) != std::string::npos; pos = nl + 1) lines.push_back(payload.substr(pos, nl - pos));
  if (lines.size() < 2) return Internal("malformed comm_grow decision");
  a->secret = lines[0];
  a->id = c->id + ".g" + std::to_string(++c->children);
  a->local_transport_usable = c->local_transport_usable;
  a->world_ranks = c->world_ranks;
  for (int r = 0; r < c->size; ++r) a->world_gens.push_back(generation_of(c, r));
  std::vector<uint64_t> hosts = member_hosts;
  std::vector<std::string> addrs = c->world_addrs ? *c->world_addrs : std::vector<std::string>();
  addrs.resize(static_cast<size_t>(c->size) > addrs.size() ? static_cast<size_t>(c->size) : addrs.size());
  for (size_t i = 1; i < lines.size(); ++i) {
    DecidedJoiner d;
    if (!decode_decided(lines[i], &d)) return Internal("malformed comm_grow decision");
    const int w = d.world;
    a->world_ranks.push_back(w);
    a->world_gens.push_back(d.gen);
    hosts.push_back(d.host);
    if (addrs.size() <= static_cast<size_t>(w)) addrs.resize(static_cast<size_t>(w) + 1);
    addrs[static_cast<size_t>(w)] = d.reach;
    reach->push_back(d.reach.empty() ? "-" : d.reach);
  }
  std::map<uint64_t, int> number;  // hosts numbered in order of each host's first rank, as at init
  for (uint64_t h : hosts) a->host_of.push_back(number.emplace(h, static_cast<int>(number.size())).first->second);
  a->world_addrs = std::move(addrs);
  return Status::Ok();
}

Status admit(comm_t c, const std::string& payload, const std::vector<Joiner>& joiners, comm_t* out);

}  // namespace

std::unique_ptr<comm_s> make_grown(const Answer& a, const CommSettings& settings, std::shared_ptr<Store> store) {
  auto g = std::make_unique<comm_s>();
  g->rank = a.rank;
  g->size = static_cast<int>(a.host_of.size());
  g->id = a.id;
  g->settings = settings;
  g->secret = a.secret;
  g->job_store = std::move(store);
  g->world_addrs = std::make_shared<std::vector<std::string>>(a.world_addrs);
  g->local_transport_usable = a.local_transport_usable;
  g->host_of = a.host_of;
  g->world_ranks = a.world_ranks;
  g->world_gens = a.world_gens;
  g->all_local = std::all_of(a.host_of.begin(), a.host_of.end(), [](int h) { return h == 0; });
  g->own_job_memory = true;  // the joiners are in no earlier domain: this communicator makes its own
  g->watch_setups = true;     // a comm_dup of it right after the grow is watched too (setup_watch.h)
  return g;
}

Status grow_communicator(comm_t c, int n_join, comm_t* out) {
  const std::string where = "rank " + std::to_string(c->rank) + ", comm " + c->id + ": comm_grow: ";
  *out = nullptr;
  COMM_RETURN_IF_ERROR(check_usable(c));
  bool store_alive = !c->job_store->dies_with_rank0();
  for (int w : c->world_ranks) store_alive = store_alive || w == 0;
  if (!store_alive) {
    if (n_join == COMM_GROW_WAITING) return Status::Ok();  // nobody can be waiting: joiners fail at their comm_init
    return Unavailable(where + "the job store was served by world rank 0, which is gone, so no joiner can find the "
                       "job; run it under comm-run --replace-failed (which serves the store), with an external store "
                       "(COMM_STORE_EXTERNAL=1 and MASTER_ADDR:MASTER_PORT served outside the ranks), or with "
                       "init_method file://");
  }
  // The lowest member decides; one broadcast tells the others (and is all a step without joiners costs).
  int64_t header[2] = {kNone, 0};
  std::string payload;
  std::vector<Joiner> joiners;
  if (c->rank == 0) {
    Status st = claim(c, n_join, &joiners);
    if (st.ok() && !joiners.empty()) st = describe(c, joiners, &payload);
    if (!st.ok()) {
      payload = std::to_string(static_cast<int>(st.code())) + "\n" + st.message();
      header[0] = kFail;
    } else if (!joiners.empty()) {
      header[0] = kGrow;
    }
    header[1] = static_cast<int64_t>(payload.size());
  }
  Status told = broadcast(c, header, sizeof header);
  if (!told.ok()) {
    if (c->rank == 0 && header[0] == kGrow) record_failed_joiners(*c->job_store, payload);
    return told.prefixed(where);
  }
  if (header[0] == kNone) return Status::Ok();
  if (header[1] < 0 || header[1] > (1 << 24)) return Internal(where + "malformed decision from rank 0");
  payload.resize(static_cast<size_t>(header[1]));
  Status got = broadcast(c, payload.data(), payload.size());
  if (!got.ok()) {
    if (c->rank == 0 && header[0] == kGrow) record_failed_joiners(*c->job_store, payload);
    return got.prefixed(where);
  }
  if (header[0] == kFail) {
    const size_t nl = payload.find('\n');
    int code = nl == std::string::npos ? COMM_ERR_INTERNAL : std::atoi(payload.substr(0, nl).c_str());
    if (code < COMM_ERR_INVALID_ARGUMENT || code > COMM_ERR_INTERNAL) code = COMM_ERR_INTERNAL;
    const std::string why = nl == std::string::npos ? payload : payload.substr(nl + 1);
    return Status(static_cast<comm_status_t>(code), where + (c->rank == 0 ? "" : "rank 0 (the lowest member): ") + why);
  }
  Status st = admit(c, payload, joiners, out);
  if (!st.ok()) record_failed_joiners(*c->job_store, payload);  // every member alike: recorded once
  return st.prefixed(where);
}

namespace {

// The decision made and known to every member: the grown communicator, joiners answered.
Status admit(comm_t c, const std::string& payload, const std::vector<Joiner>& joiners, comm_t* out) {
  // The members' hosts, so joiners on a member's host share its host number.
  std::vector<uint64_t> hosts(static_cast<size_t>(c->size));
  uint64_t mine = host_hash();
  {
    algo::CollArgs args;
    args.kind = transport::CollKind::kAllgather;
    args.sendbuf = &mine;
    args.recvbuf = hosts.data();
    args.count = 1;
    args.dtype = COMM_UINT64;
    COMM_RETURN_IF_ERROR(run_blocking(c, args));
  }
  Answer a;
  std::vector<std::string> reach;
  COMM_RETURN_IF_ERROR(plan(c, payload, hosts, &a, &reach));
  if (c->rank == 0) {
    for (size_t i = 0; i < joiners.size(); ++i) {
      Answer theirs = a;
      theirs.rank = c->size + static_cast<int>(i);
      COMM_RETURN_IF_ERROR(c->job_store->set(answer_key(joiners[i].ticket), encode_answer(theirs)));
    }
  }
  a.rank = c->rank;
  COMM_INFO(kInit, "comm %s rank %d: comm_grow admits %zu joiner(s) into comm %s of %zu ranks", c->id.c_str(), c->rank,
            reach.size(), a.id.c_str(), a.host_of.size());
  std::unique_ptr<comm_s> g = make_grown(a, c->settings, c->job_store);
  // A member or a joiner that dies from here on ends the others' set-up waits early (setup_watch.h).
  std::vector<int> members(static_cast<size_t>(c->size));
  for (int r = 0; r < c->size; ++r) members[static_cast<size_t>(r)] = r;
  g->setup_watch = SetupWatch::for_member(c, c->job_store, a.id, std::move(members), g->size - c->size);
  return finish_communicator(std::move(g), out);
}

}  // namespace

}  // namespace comm::grow

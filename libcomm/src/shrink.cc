// comm_shrink: the survivors of a communicator (healthy or broken) make a new one without the
// ranks they exclude, renumbered densely in the old order. The old communicator's transport is
// never used: after a failure it may be aborted, and its connections lead to the dead rank.
//
// Where the survivors meet (docs/design/core.md, "Shrinking a communicator"): in the job store when
// it outlives every rank (file://, memory://) or when world rank 0, whose process serves the TCP
// store, is among the survivors; otherwise the lowest survivor serves a store of its own at the
// host the init verdict's address table gives (comm_s::world_addrs), on the first free port of
// a short list every survivor derives from the job secret and the new communicator's id. The
// others try the ports in turn; the store's token (derived the same way) makes another job's
// store or another service on such a port refuse them, and they move on.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "communicator.h"
#include "device/device.h"
#include "hash.h"
#include "log.h"
#include "rank_list.h"
#include "setup_watch.h"
#include "tls/tls.h"
#include "store/store.h"

namespace comm {
namespace {

constexpr int kRescuePorts = 8;
// 20000-32767: below Linux's default ephemeral range (32768-60999), where the kernel's own picks
// for other processes' connections and port-0 listeners would collide with ours.
constexpr int kRescuePortBase = 20000, kRescuePortSpan = 12768;
constexpr int kProbeMs = 200;  // per port and try: the lowest survivor may start its store later

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::vector<int> rescue_ports(const std::string& secret, const std::string& id) {
  std::vector<int> ports;
  for (int i = 0; i < kRescuePorts; ++i)
    ports.push_back(kRescuePortBase + static_cast<int>(fnv1a(secret + "/shrink/" + id + "/" + std::to_string(i)) %
                                                      kRescuePortSpan));
  return ports;
}

// The lowest survivor: a store on the first port of the list that is free.
Status serve_rescue_store(comm_t c, const std::string& id, const std::string& token, std::shared_ptr<Store>* out) {
  Status last = Status::Ok();
  for (int port : rescue_ports(c->secret, id)) {
    TcpStoreOptions o;
    o.port = port;
    o.is_server = true;
    o.timeout_ms = c->settings.timeout_ms;
    o.auth_token = token;
    COMM_RETURN_IF_ERROR(tls::context_from_env(c->settings.tls, token, "store", "the shrink token", &o.tls));
    last = make_tcp_store(o, out);
    if (last.ok()) {
      COMM_INFO(kInit, "comm %s rank %d: comm_shrink: serving the survivors' store on port %d", c->id.c_str(), c->rank,
                port);
      return last;
    }
  }
  return last.prefixed("none of the " + std::to_string(kRescuePorts) +
                       " ports derived for the shrink's store is free (" +
                       rank_list_bracketed(rescue_ports(c->secret, id)) + "): ");
}

// The others: each port of the list in turn until the lowest survivor's store answers.
Status join_rescue_store(comm_t c, const std::string& id, const std::string& token, const std::string& host,
                         int leader, std::shared_ptr<Store>* out) {
  Deadline deadline = Deadline::after_ms(c->settings.timeout_ms);
  const std::vector<int> ports = rescue_ports(c->secret, id);
  std::string last;
  while (!deadline.expired()) {
    for (int port : ports) {
      TcpStoreOptions o;
      o.host = host;
      o.port = port;
      o.timeout_ms = kProbeMs;
      o.auth_token = token;
      COMM_RETURN_IF_ERROR(tls::context_from_env(c->settings.tls, token, "store", "the shrink token", &o.tls));
      std::shared_ptr<Store> probe;
      Status st = make_tcp_store(o, &probe);
      if (st.ok()) {
        probe.reset();
        o.timeout_ms = c->settings.timeout_ms;  // found: the real client, with the communicator's timeout
        return make_tcp_store(o, out);
      }
      last = st.message();
      if (deadline.expired()) break;
    }
  }
  return Timeout("rank " + std::to_string(leader) + " (the lowest survivor) served no shrink store at " + host +
                 " on ports " + rank_list_bracketed(ports) + " within " + std::to_string(c->settings.timeout_ms) +
                 " ms (last: " + last + "); is it alive, did it call comm_shrink with the same list, and can this "
                 "host reach it?");
}

}  // namespace

Status shrink_communicator(comm_t c, const std::vector<int>& excluded_in, comm_t* out) {
  const std::string where = "rank " + std::to_string(c->rank) + ", comm " + c->id + ": ";
  std::vector<int> excluded = excluded_in;
  std::sort(excluded.begin(), excluded.end());
  for (size_t i = 0; i < excluded.size(); ++i) {
    const int r = excluded[i];
    if (r < 0 || r >= c->size)
      return InvalidArgument(where + "excluded rank " + std::to_string(r) + " is not a rank of this communicator (0.." +
                             std::to_string(c->size - 1) + ")");
    if (r == c->rank)
      return InvalidArgument(where + "this rank excludes itself; a rank that leaves calls comm_destroy (or exits) "
                             "instead of comm_shrink");
    if (i > 0 && excluded[i - 1] == r)
      return InvalidArgument(where + "rank " + std::to_string(r) + " is excluded twice; list each rank once");
  }
  if (c->shrunk)
    return InvalidUsage(where + "comm_shrink was already called on this communicator; shrink the communicator it made");
  // The device path: an NCCL communicator would need ncclCommShrink; host collectives go on here.
  COMM_RETURN_IF_ERROR(device::check_shrink(c));

  std::vector<int> members;  // old ranks, in order: a member's new rank is its place here
  int new_rank = -1;
  for (int r = 0; r < c->size; ++r) {
    if (std::binary_search(excluded.begin(), excluded.end(), r)) continue;
    if (r == c->rank) new_rank = static_cast<int>(members.size());
    members.push_back(r);
  }
  // Every survivor has called as many dup/split/shrink on c as the others: the same id everywhere.
  const std::string id = c->id + ".k" + std::to_string(++c->children);
  const int leader = members[0];
  const bool leader_is_me = new_rank == 0;
  bool store_alive = !c->job_store->dies_with_rank0();
  for (int r : members) store_alive = store_alive || c->world_ranks[static_cast<size_t>(r)] == 0;

  std::shared_ptr<Store> base = c->job_store;
  if (!store_alive) {
    const std::string token = hex64(fnv1a(c->secret + "/shrink-token/" + id));
    if (leader_is_me) {
      COMM_RETURN_IF_ERROR(serve_rescue_store(c, id, token, &base).prefixed(where + "comm_shrink: "));
    } else {
      const bool leader_local = c->host_of[static_cast<size_t>(leader)] == c->host_of[static_cast<size_t>(c->rank)];
      const size_t leader_world = static_cast<size_t>(c->world_ranks[static_cast<size_t>(leader)]);
      std::string host = c->world_addrs && leader_world < c->world_addrs->size() ? (*c->world_addrs)[leader_world] : "";
      if (leader_local) host = "127.0.0.1";  // the store listens on every address
      if (host.empty())
        return Unavailable(where + "comm_shrink: world rank 0 (the store's server) is excluded and the address of "
                           "rank " + std::to_string(leader) + " (the lowest survivor) is unknown; use init_method "
                           "file:// for jobs that shrink without rank 0");
      COMM_RETURN_IF_ERROR(join_rescue_store(c, id, token, host, leader, &base).prefixed(where + "comm_shrink: "));
    }
  }

  // Agreement: each survivor publishes its list; the lowest compares and publishes one verdict
  // (a new secret, or the difference), so every survivor it expects fails alike or none does.
  // A survivor that dies meanwhile (a second failure right after comm_agree_failed) closes its
  // connections of this communicator: the watch ends the others' waits on it within a second
  // instead of at COMM_TIMEOUT_MS, and they agree again (setup_watch.h; a chaos run lost 10 s
  // when the lowest survivor, whose verdict the others waited for, was killed here). The same
  // watch then covers the new communicator's set-up (create_child).
  std::shared_ptr<SetupWatch> watch = SetupWatch::for_member(c, base, id, members, 0);
  std::shared_ptr<Store> store = make_watched_store(make_prefix_store(base, "comm/" + id + "/shrink"),
                                                    [watch] { return watch->check(); }, 250);
  Deadline deadline = Deadline::after_ms(c->settings.timeout_ms);
  const std::string mine = rank_list_bracketed(excluded);  // what every survivor must agree on
  COMM_RETURN_IF_ERROR(store->set("list/" + std::to_string(c->rank), mine).prefixed(where + "comm_shrink: "));
  std::string secret;
  if (leader_is_me) {
    std::string problems;
    for (size_t i = 1; i < members.size(); ++i) {
      std::string theirs;
      Status st = store->get("list/" + std::to_string(members[i]), &theirs, deadline);
      if (!st.ok() && st.code() != COMM_ERR_TIMEOUT) return st.prefixed(where + "comm_shrink: ");
      if (!st.ok())
        return Timeout(where + "comm_shrink: rank " + std::to_string(members[i]) + " did not join the shrink within " +
                       std::to_string(c->settings.timeout_ms) + " ms; is it alive and calling comm_shrink? If it "
                       "died, exclude it too (every survivor passes the same list)");
      if (theirs != mine)
      {
        if (!problems.empty()) problems += "; ";
        problems += "rank " + std::to_string(members[i]) + " excludes " + theirs;
      }
    }
    COMM_RETURN_IF_ERROR(random_secret(&secret));
    const std::string verdict = problems.empty() ? "OK\n" + secret + "\n" + mine : "FAIL\n" + problems;
    COMM_RETURN_IF_ERROR(store->set("verdict", verdict));
    if (!problems.empty()) {
      (void)wait_read_by_all(*store, "verdict", static_cast<int>(members.size()), deadline);
      return InvalidUsage(where + "comm_shrink: the survivors disagree on the ranks to exclude: rank " +
                          std::to_string(c->rank) + " excludes " + mine + "; " + problems +
                          "; every survivor must pass the same list");
    }
  } else {
    std::string verdict;
    Status st = store->get("verdict", &verdict, deadline);
    if (!st.ok() && st.code() != COMM_ERR_TIMEOUT) return st.prefixed(where + "comm_shrink: ");
    if (!st.ok())
      return Timeout(where + "comm_shrink: rank " + std::to_string(leader) + " (the lowest survivor) did not answer "
                     "within " + std::to_string(c->settings.timeout_ms) + " ms; is it alive and calling comm_shrink "
                     "with the same list " + mine + "?");
    (void)confirm_read(*store, "verdict", new_rank);
    if (verdict.rfind("FAIL\n", 0) == 0)
      return InvalidUsage(where + "comm_shrink: the survivors disagree on the ranks to exclude: rank " +
                          std::to_string(leader) + " (the lowest survivor) found: " + verdict.substr(5) + " (it "
                          "excludes others than " + mine + "); every survivor must pass the same list");
    const size_t nl = verdict.find('\n', 3);
    if (verdict.rfind("OK\n", 0) != 0 || nl == std::string::npos) return Internal(where + "malformed shrink verdict");
    secret = verdict.substr(3, nl - 3);
    if (verdict.substr(nl + 1) != mine)
      return InvalidUsage(where + "comm_shrink: rank " + std::to_string(leader) + " (the lowest survivor) and the "
                          "ranks it waited for exclude " + verdict.substr(nl + 1) + ", but this rank excludes " +
                          mine + "; every survivor must pass the same list");
  }

  comm_t made = nullptr;
  COMM_RETURN_IF_ERROR(create_child(c, id, new_rank, members, &made, base, secret, watch).prefixed(where + "comm_shrink: "));
  Status device_st = device::shrink(c, made, excluded);
  if (!device_st.ok()) {
    destroy_communicator(made);
    return device_st;
  }
  {
    // The old communicator is done: every call but comm_destroy says so (check_usable).
    std::lock_guard<std::mutex> lock(c->state_mu);
    c->shrunk = true;
    c->broken = InvalidUsage("rank " + std::to_string(c->rank) + ", comm " + c->id + ": comm_shrink made comm " + id +
                             " from this communicator; only comm_destroy is allowed on it now (use the new one)");
    c->is_broken.store(true, std::memory_order_release);
  }
  COMM_INFO(kInit, "comm %s rank %d: comm_shrink excluded %s: now rank %d of %d in comm %s", c->id.c_str(), c->rank,
            mine.c_str(), new_rank, static_cast<int>(members.size()), id.c_str());
  *out = made;
  return Status::Ok();
}

}  // namespace comm

// Connecting a communicator: the transports the plan (or COMM_TRANSPORT) names, through the
// transport registry; a routed transport where local and remote peers take different ones.
#include "connect.h"

#include <map>

#include "common/arrivals.h"
#include "interfaces.h"
#include "log.h"
#include "params.h"
#include "process_plan.h"
#include "registry.h"
#include "setup_watch.h"
#include "tls/tls.h"

namespace comm {
namespace {

// A communicator of one rank has no peers; algorithms only copy locally, so any
// attempt to reach a peer is a bug worth a clear message.
class LoneTransport final : public transport::Transport {
 public:
  explicit LoneTransport(transport::Options o) : Transport(std::move(o)) {}
  const char* name() const override { return "none (1 rank)"; }
  // transport.h's checks refuse every peer of a one-rank communicator; kept for its words.
  Status post_request(const Post& call, transport::RequestId*) override {
    return Internal(std::string(call.is_send ? "send to" : "receive from") + " rank " + std::to_string(call.peer) +
                    " in a communicator of one rank");
  }
  Status wait(const transport::RequestId*, size_t n) override {
    return n == 0 ? Status::Ok() : Internal("wait in a communicator of one rank");
  }
  Status test(transport::RequestId, bool* done) override {
    *done = true;
    return Status::Ok();
  }
  void notify_peers(const Status&, uint64_t) override {}
  void abort() override {}
};

bool every_rank_alone(const std::vector<int>& host_of) {
  std::vector<int> seen(host_of.size(), 0);
  for (int h : host_of)
    if (h >= 0 && static_cast<size_t>(h) < seen.size() && seen[static_cast<size_t>(h)]++ > 0) return false;
  return true;
}

// The host transport for ranks on this host and for ranks on other hosts: the topology plan's
// per peer class (same host: shm; other host: ucx on InfiniBand/RoCE hosts, else socket), or the
// forced one (COMM_TRANSPORT / comm_config_t.transport). Every rank decides alike: the plan's
// choices are in the init agreement, the host map is the same everywhere.
struct Choice {
  std::string transport;
  std::string why;
};
void choose(const CommSettings& s, Choice* near, Choice* far) {
  // nccl is about device buffers: host buffers take the plan's transports, as with auto.
  if (s.transport != "auto" && s.transport != "nccl") {
    near->transport = far->transport = s.transport;
    near->why = far->why = "COMM_TRANSPORT / comm_config_t.transport = " + s.transport + " forces it";
    return;
  }
  const topology::Plan& plan = topology::plan_for_process();
  const topology::PeerPlan& local = plan.peer(topology::PeerClass::kSameNuma);
  const topology::PeerPlan& remote = plan.peer(topology::PeerClass::kOtherHost);
  *near = {local.host_transport, "topology plan: " + local.why};
  *far = {remote.host_transport, "topology plan: " + remote.why};
}

// The store of a transport of this communicator: its own prefix, so transports never collide.
// A grown communicator's set-up watches its waits (setup_watch.h): a slice of 250 ms.
std::shared_ptr<Store> transport_store(comm_t c, const std::string& kind) {
  std::shared_ptr<Store> store = make_prefix_store(c->job_store, "comm/" + c->id + "/" + kind);
  if (!c->setup_watch) return store;
  return make_watched_store(std::move(store), [watch = c->setup_watch] { return watch->check(); }, 250);
}

transport::ConnectRequest request_for(comm_t c, const std::string& kind, const transport::Options& opt) {
  transport::ConnectRequest r;
  r.options = opt;
  r.options.store = transport_store(c, kind);
  r.comm_id = c->id;
  r.world_ranks = c->world_ranks;
  r.job_memory = &c->job_memory;
  r.world = c->id == "0" || c->own_job_memory;
  return r;
}

// Where a socket-based transport listens (topology/interfaces.h): the addresses of the
// interfaces COMM_SOCKET_IFNAME, else NCCL_SOCKET_IFNAME, chooses (the route to the store
// first), else lo when every rank is on this host.
Status choose_listen_address(comm_t c, transport::ListenAddress* out) {
  std::string why;
  Status st = topology::choose_socket_addresses(c->all_local, &out->addresses, &why);
  if (!st.ok()) return st.prefixed("comm " + c->id + " rank " + std::to_string(c->rank) + ": socket transport: ");
  out->why = why;
  out->route_ifname = topology::store_route_interface();
  return Status::Ok();
}

// A transport that reaches every peer it is asked for (not a host-local one).
Status create_host_transport(const std::string& kind, const transport::Options& opt, comm_t c,
                             std::unique_ptr<transport::Transport>* out) {
  const transport::TransportInfo* t = transport::find(kind);
  if (t == nullptr || t->host_local)
    return Internal("the plan chose '" + kind + "' for peers on other hosts, which no transport here can reach");
  transport::ConnectRequest r = request_for(c, kind, opt);
  if (t->listens_on_interface) COMM_RETURN_IF_ERROR(choose_listen_address(c, &r.options.listen));
  // The world's first transport that listens early takes the listener whose address came in the verdict.
  if (t->listens_early && c->early_listener) r.options.early = std::move(c->early_listener);
  if (!t->built())
    return Unavailable("transport '" + kind + "' is not available here (" + t->not_built() + ")");
  transport::Connected connected;
  COMM_RETURN_IF_ERROR(t->connect(r, &connected));
  *out = std::move(connected.transport);
  return Status::Ok();
}

bool is_host_local(const std::string& kind) {
  const transport::TransportInfo* t = transport::find(kind);
  return t != nullptr && t->host_local;
}

std::string ranks_where(comm_t c, bool local) {
  std::string out;
  for (int r = 0; r < c->size; ++r)
    if (r != c->rank && (c->host_of[static_cast<size_t>(r)] == c->host_of[static_cast<size_t>(c->rank)]) == local)
    {
      if (!out.empty()) out += ',';
      out += std::to_string(r);  // appended apart: GCC 12 warns (-Wrestrict) on "," + to_string(r)
    }
  return out;
}

// The profile's transport name for this communicator, decided before it connects (the
// communicator knobs shape the connection): shm (every rank on one host), socket, ucx,
// shm+socket, shm+ucx, socket+ucx -- as connect_transport() builds it.
std::string profile_transport(comm_t c) {
  Choice near, far;
  choose(c->settings, &near, &far);
  // A forced transport that reaches other hosts serves every peer.
  if (c->settings.transport != "auto" && c->settings.transport != "nccl" && !is_host_local(c->settings.transport))
    return c->settings.transport;
  const std::string& remote = far.transport;
  const std::string fallback = transport::first_reaching_other_hosts();
  if (every_rank_alone(c->host_of)) return remote;
  if (!c->local_transport_usable) return c->all_local || remote == fallback ? fallback : fallback + "+" + remote;
  return c->all_local ? near.transport : near.transport + "+" + remote;
}

// The tuning profile's entries for this communicator, and the INFO lines that say which
// apply, which are ignored (another rank count or transport) or trimmed (environment), and why.
void match_tuning(comm_t c) {
  std::vector<std::string> notes;
  const std::string transport = profile_transport(c);
  c->tuning = tuning::Applied::match(c->size > 1 ? c->settings.profile : nullptr, c->size, transport, &notes);
  if (!c->settings.profile || c->size == 1) return;
  const tuning::Profile& p = *c->settings.profile;
  for (const auto& n : notes) COMM_INFO(kInit, "comm %s rank %d: tuning: %s", c->id.c_str(), c->rank, n.c_str());
  bool host_entries = false;  // NCCL entries act on NCCL's environment, not on this communicator
  for (const auto& e : p.entries) host_entries = host_entries || !e.is_nccl();
  if (!host_entries) return;
  if (c->tuning->call_entries() == 0 && c->tuning->comm_settings().empty() && c->tuning->engine_entries() == 0) {
    COMM_WARN(kInit, "comm %s rank %d: tuning profile %s has no entry for %d ranks over %s; defaults apply "
              "(COMM_DEBUG=INFO lists the entries and why each is ignored)", c->id.c_str(), c->rank, p.path.c_str(),
              c->size, transport.c_str());
    return;
  }
  COMM_INFO(kInit, "comm %s rank %d: tuning profile %s (hash %s): %zu per-call entries and %zu engine entries apply "
            "to %d ranks over %s; communicator settings: %s", c->id.c_str(), c->rank, p.path.c_str(), p.hash.c_str(),
            c->tuning->call_entries(), c->tuning->engine_entries(), c->size, transport.c_str(),
            c->tuning->comm_settings().empty() ? "none" : c->tuning->comm_settings().c_str());
}

}  // namespace

// The plan's transports per peer (above), shm falling back to sockets where it cannot be set
// up; COMM_TRANSPORT=shm needs one host. Every rank of the communicator decides alike: the host
// map is the same everywhere and shm's setup outcome is agreed.
Status connect_transport(comm_t c) {
  const std::string fallback = transport::first_reaching_other_hosts();  // local peers without shm
  transport::Options opt;
  opt.rank = c->rank;
  opt.size = c->size;
  opt.timeout_ms = c->settings.timeout_ms;
  opt.heartbeat_ms = c->settings.heartbeat_ms;
  opt.secret = c->secret;
  if (c->settings.tls) {
    // The data path's key comes from the job secret (fresh per job, handed out through the
    // store, itself under TLS), or the cluster's certificates (libcomm/base/tls/tls.h).
    COMM_RETURN_IF_ERROR(tls::context_from_env(true, c->secret, tls::kDataPathContext, "the job secret", &opt.tls));
    std::string why;
    const bool ktls = tls::kernel_tls_available(&why);
    COMM_INFO(kNet, "comm %s rank %d: socket connections run TLS 1.3 (%s); kernel TLS %s: %s", c->id.c_str(), c->rank,
              opt.tls->uses_psk() ? "pre-shared key" : "certificates", ktls ? "available" : "not available",
              why.c_str());
  }
  opt.store = transport_store(c, fallback);
  opt.comm_label = "comm " + c->id;
  opt.all_local = c->all_local;
  opt.host_of = c->host_of;
  c->send_seq.assign(static_cast<size_t>(c->size), 0);
  c->recv_seq.assign(static_cast<size_t>(c->size), 0);
  // Straggler detection (transports/common/arrivals.h): every transport of this communicator
  // reports into one record.
  int64_t late_ms = 0;
  COMM_RETURN_IF_ERROR(params::get_int("COMM_STRAGGLER_MS", &late_ms));
  c->stats.init(c->size, "comm " + c->id + " rank " + std::to_string(c->rank), late_ms);
  if (late_ms > 0 && c->size > 1) c->arrivals = opt.arrivals = std::make_shared<transport::Arrivals>(c->size);
  match_tuning(c);
  opt.shm_slot_bytes = c->tuning->shm_slot_bytes();
  opt.socket_nconns = c->tuning->socket_nconns();
  if (c->size == 1) {
    c->transport = std::make_unique<LoneTransport>(opt);
    return Status::Ok();
  }
  Choice near_choice, far_choice;
  choose(c->settings, &near_choice, &far_choice);
  const std::string local_peers = ranks_where(c, true), remote_peers = ranks_where(c, false);
  const bool forced_local = is_host_local(c->settings.transport);
  std::unique_ptr<transport::Transport> near;
  const transport::TransportInfo* local = transport::find(near_choice.transport);
  if (local != nullptr && local->host_local && c->local_transport_usable && !every_rank_alone(c->host_of)) {
    transport::Connected outcome;
    COMM_RETURN_IF_ERROR(local->connect(request_for(c, local->name, opt), &outcome));
    if (!outcome.usable) {
      if (forced_local)
        return Unavailable("COMM_TRANSPORT=" + c->settings.transport + ": shared memory could not be set up: " +
                           outcome.why_not);
      COMM_WARN(kNet, "comm %s rank %d: shared memory unavailable (%s); local ranks talk over %s", c->id.c_str(),
                c->rank, outcome.why_not.c_str(), fallback.c_str());
      c->local_transport_usable = false;
    }
    near = std::move(outcome.transport);
    if (!near) near_choice = {fallback, "shared memory unavailable: " + outcome.why_not};
  } else if (local != nullptr && local->host_local) {
    near_choice = {fallback, c->local_transport_usable ? "no two ranks share a host" : "shared memory unavailable on some host"};
  }
  if (!local_peers.empty())
    COMM_INFO(kNet, "comm %s rank %d: ranks on this host (%s) -> %s (%s)", c->id.c_str(), c->rank, local_peers.c_str(),
              near ? near->name() : near_choice.transport.c_str(), near_choice.why.c_str());
  if (!remote_peers.empty())
    COMM_INFO(kNet, "comm %s rank %d: ranks on other hosts (%s) -> %s (%s)", c->id.c_str(), c->rank,
              remote_peers.c_str(), far_choice.transport.c_str(), far_choice.why.c_str());
  if (near && c->all_local) {
    c->transport = std::move(near);
    return Status::Ok();
  }
  // One transport reaches every peer when nothing local is special (or local and remote agree).
  const std::string& far_kind = c->all_local ? near_choice.transport : far_choice.transport;
  std::unique_ptr<transport::Transport> far;
  COMM_RETURN_IF_ERROR(create_host_transport(far_kind, opt, c, &far));
  if (!near && (near_choice.transport != far_kind && !local_peers.empty() && !remote_peers.empty())) {
    // Local ranks on another transport than remote ones (e.g. sockets inside, UCX between).
    COMM_RETURN_IF_ERROR(create_host_transport(near_choice.transport, opt, c, &near));
  }
  if (!near) {
    c->transport = std::move(far);
    return Status::Ok();
  }
  std::vector<bool> is_local(static_cast<size_t>(c->size));
  for (int r = 0; r < c->size; ++r)
    is_local[static_cast<size_t>(r)] = c->host_of[static_cast<size_t>(r)] == c->host_of[static_cast<size_t>(c->rank)];
  c->transport = transport::make_routed_transport(opt, std::move(near), std::move(far), std::move(is_local));
  return Status::Ok();
}

}  // namespace comm

// Communicator lifecycle: settings, rendezvous, children (dup/split) and teardown. What the
// ranks agree on at init is init_agreement.cc's business; which transports connect the ranks,
// connect.cc's.
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>

#include "communicator.h"
#include "algorithms/algorithm.h"
#include "connect.h"
#include "device/device.h"
#include "grow.h"
#include "init_agreement.h"
#include "interfaces.h"
#include "log.h"
#include "observe/live.h"
#include "params.h"
#include "process_plan.h"
#include "reachability.h"
#include "registry.h"
#include "rendezvous.h"
#include "setup_watch.h"
#include "tls/tls.h"
#include "tuning/nccl_settings.h"
#include "version.h"
#include "watch.h"

namespace comm {

Status random_secret(std::string* out) {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return SystemError("getrandom failed: " + errno_string(errno));
    }
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  out->clear();
  for (unsigned char b : bytes) {
    out->push_back(hex[b >> 4]);
    out->push_back(hex[b & 15]);
  }
  return Status::Ok();
}

Status resolve_settings(const comm_config_t& cfg, CommSettings* s) {
  if (cfg.timeout_ms != COMM_UNSET) {
    if (cfg.timeout_ms <= 0)
      return InvalidArgument("comm_config_t.timeout_ms=" + std::to_string(cfg.timeout_ms) +
                             " must be positive (or COMM_UNSET)");
    s->timeout_ms = cfg.timeout_ms;
  } else {
    int64_t t = 0;
    COMM_RETURN_IF_ERROR(params::get_int("COMM_TIMEOUT_MS", &t));
    s->timeout_ms = static_cast<int>(t);
  }
  if (cfg.transport != nullptr) {
    s->transport = cfg.transport;
  } else {
    COMM_RETURN_IF_ERROR(params::get_string("COMM_TRANSPORT", &s->transport));
  }
  for (auto& ch : s->transport) ch = static_cast<char>(tolower(static_cast<unsigned char>(ch)));
  // auto and nccl are the core's modes (the plan's transports; device buffers through NCCL);
  // every other name is a host transport's, from the registry.
  if (s->transport != "auto" && s->transport != "nccl") {
    const transport::TransportInfo* t = transport::find(s->transport);
    if (t == nullptr)
      return InvalidArgument("transport '" + s->transport + "' is unknown; use auto, nccl, " +
                             transport::names(false));
    if (!t->built())
      return Unavailable("transport '" + s->transport + "' is not available here (" + t->not_built() +
                         "); use COMM_TRANSPORT=auto, " + transport::names(true));
  }
  COMM_RETURN_IF_ERROR(params::get_string("COMM_ALGO", &s->forced_algo));
  // A name no collective knows is refused here, on every rank alike, not at the first call.
  if (!s->forced_algo.empty()) {
    Status known = algo::check_name(s->forced_algo, "COMM_ALGO");
    if (!known.ok()) return InvalidArgument(known.message() + "; set COMM_ALGO to one of these, or unset it");
  }
  if (cfg.tls != COMM_UNSET) {
    if (cfg.tls != 0 && cfg.tls != 1)
      return InvalidArgument("comm_config_t.tls = " + std::to_string(cfg.tls) + " must be 0, 1 (or COMM_UNSET)");
    s->tls = cfg.tls == 1;
  } else {
    COMM_RETURN_IF_ERROR(tls::enabled_from_env(&s->tls));
  }
  int64_t heartbeat = 0;
  COMM_RETURN_IF_ERROR(params::get_int("COMM_HEARTBEAT_MS", &heartbeat));
  s->heartbeat_ms = static_cast<int>(heartbeat);
  int64_t strict = 0;
  COMM_RETURN_IF_ERROR(params::get_int("COMM_CHECK_COLLECTIVES", &strict));
  s->check_collectives = strict != 0;
  int64_t chunk = 0;
  COMM_RETURN_IF_ERROR(params::get_int("COMM_CHUNK_BYTES", &chunk));
  s->chunk_bytes = static_cast<size_t>(chunk);
  // Parsed before the rendezvous, so a bad profile fails every rank at once, naming the entry;
  // its hash joins what ranks must agree on (fingerprint below).
  return tuning::load_from_env(&s->profile, &s->tuning_hash);
}

namespace {

// init returns only once every rank is connected, so nobody tears the store down early.
Status init_barrier(comm_t c) {
  if (c->size == 1) return Status::Ok();
  algo::CollArgs args;
  args.kind = transport::CollKind::kBarrier;
  stamp(c, &args);
  args.tag.coll = transport::CollKind::kInternal;
  return execute(c, args);
}

}  // namespace

// Once per process, at the first comm_init (NCCL prints its version the same way): the version
// line, and a warning for each COMM_* variable that is set but means nothing to libcomm.
void announce_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    COMM_VERSION(kInit, "libcomm version %s", version::text());
    for (const auto& w : params::unknown_variables()) COMM_WARN(kEnv, "%s", w.c_str());
  });
}

Status init_communicator(const comm_config_t& cfg, comm_t* out) {
  int64_t join = 0;
  COMM_RETURN_IF_ERROR(params::get_int("COMM_JOIN", &join));
  if (join != 0) return grow::join_communicator(cfg, out);  // waits for the job's next comm_grow
  auto c = std::make_unique<comm_s>();
  COMM_RETURN_IF_ERROR(resolve_settings(cfg, &c->settings));
  Identity id;
  COMM_RETURN_IF_ERROR(resolve_identity(cfg, &id));
  c->rank = id.rank;
  c->size = id.world_size;
  c->id.assign(1, '0');  // not = "0": GCC 12 warns (-Wrestrict) once agree_at_init is out of line
  log::set_thread_rank(c->rank);
  announce_once();
  std::string token;
  COMM_RETURN_IF_ERROR(params::get_string("COMM_AUTH_TOKEN", &token));
  // COMM_TLS: the store's key comes from COMM_AUTH_TOKEN (or the certificates); the job secret
  // then travels inside TLS (libcomm/base/tls/tls.h).
  std::shared_ptr<tls::Context> store_tls;
  COMM_RETURN_IF_ERROR(tls::context_from_env(c->settings.tls, token, "store", "COMM_AUTH_TOKEN", &store_tls));
  COMM_RETURN_IF_ERROR(open_store(id, c->settings.timeout_ms, token, &c->job_store, store_tls));
  // Once per process: plan, NCCL_* env (the profile's over the plan's); never fails.
  std::vector<std::string> nccl_notes;
  const auto nccl = tuning::nccl_settings(c->settings.profile.get(), c->size, &nccl_notes);
  for (const auto& n : nccl_notes) COMM_INFO(kEnv, "rank %d: tuning: %s", c->rank, n.c_str());
  topology::prepare_process(c->job_store.get(), nccl);
  // The route to the store's host puts its interface first among a socket listener's (interfaces.h).
  topology::remember_store_host(id.store_host);
  Agreed agreed;  // its tree server lives until comm_init returns
  COMM_RETURN_IF_ERROR(agree_at_init(*c->job_store, id, c->settings, &c->secret, &agreed));
  c->all_local = agreed.all_local;
  c->host_of = std::move(agreed.host_of);
  c->world_addrs = std::make_shared<std::vector<std::string>>(std::move(agreed.hosts));
  c->early_listener = std::move(agreed.early);  // the transport that listens early adopts it (connect.cc)
  if (c->early_listener && !c->all_local) {
    // Every published address of a few other hosts proven both ways before any connection
    // needs one (reachability.h): the socket mesh's dials then start with paths that work.
    ReachInput reach;
    reach.rank = c->rank;
    reach.host_of = c->host_of;
    reach.table = c->early_listener->table;
    reach.timeout_ms = c->settings.timeout_ms;
    COMM_RETURN_IF_ERROR(params::socket_connect_timeout_ms(&reach.connect_timeout_ms));
    reach.tree = &agreed.tree;  // the summary goes down the verdict's tree
    COMM_RETURN_IF_ERROR(prove_reachability(*c->job_store, reach));
  }
  c->world_ranks.resize(static_cast<size_t>(c->size));
  for (int r = 0; r < c->size; ++r) c->world_ranks[static_cast<size_t>(r)] = r;
  c->world_gens.assign(static_cast<size_t>(c->size), 0);
  COMM_RETURN_IF_ERROR(connect_transport(c.get()));
  c->early_listener.reset();  // not adopted (no transport that listens early after all): closed
  // The address tables are read: released before the barrier, so once rank 0 passes it every
  // rank has let go of its store connection.
  c->job_store->release_idle();
  COMM_RETURN_IF_ERROR(init_barrier(c.get()));
  // Asked for NCCL: made now, so a job that cannot have it fails here, on every rank, saying why.
  if (c->settings.transport == "nccl") COMM_RETURN_IF_ERROR(device::init_forced(c.get()));
  // Up: the store is needed again only by comm_split/dup, which reconnect (docs/design/base.md,
  // "The store's connections"); rank 0 then holds no connection per rank for the job's life. (NCCL may
  // have used it just now.)
  c->job_store->release_idle();
  if (log::enabled(log::Level::kInfo, log::kInit)) {
    std::string vars;
    for (const auto& v : params::set_variables()) vars += " " + v;
    COMM_INFO(kInit, "rank %d of %d ready: libcomm %s; init %s; transport %s; timeout %d ms; algorithm %s; set:%s",
              c->rank, c->size, version::text(), id.init_method.c_str(), c->transport->name(),
              c->settings.timeout_ms, c->settings.forced_algo.empty() ? "auto" : c->settings.forced_algo.c_str(),
              vars.empty() ? " nothing" : vars.c_str());
  }
  start_watcher(c.get());
  observe::attach(c.get());  // the metrics see it from now on (observe/live.h)
  *out = c.release();
  return Status::Ok();
}

Status create_child(comm_t parent, const std::string& id, int rank, const std::vector<int>& members, comm_t* out,
                    std::shared_ptr<Store> store, const std::string& secret, std::shared_ptr<SetupWatch> watch) {
  auto c = std::make_unique<comm_s>();
  c->rank = rank;
  c->size = static_cast<int>(members.size());
  c->id = id;
  c->settings = parent->settings;
  c->secret = secret.empty() ? parent->secret : secret;
  c->job_store = store ? std::move(store) : parent->job_store;
  c->world_addrs = parent->world_addrs;
  c->job_memory = parent->job_memory;
  c->local_transport_usable = parent->local_transport_usable;
  // Hosts renumbered in order of each host's first member, as the world's are.
  std::map<int, int> renumber;
  for (int p : members) {
    const int h = parent->host_of[static_cast<size_t>(p)];
    renumber.emplace(h, static_cast<int>(renumber.size()));
    c->host_of.push_back(renumber[h]);
    c->world_ranks.push_back(parent->world_ranks[static_cast<size_t>(p)]);
    c->world_gens.push_back(grow::generation_of(parent, p));
  }
  c->all_local = renumber.size() == 1;
  if (watch || parent->watch_setups) {
    c->watch_setups = true;
    c->setup_watch = watch ? std::move(watch) : SetupWatch::for_member(parent, c->job_store, id, members, 0);
  }
  return finish_communicator(std::move(c), out);
}

Status finish_communicator(std::unique_ptr<comm_s> c, comm_t* out) {
  Status st = connect_transport(c.get());
  if (st.ok()) st = init_barrier(c.get());
  if (c->setup_watch) c->setup_watch->end();  // its parent may go; later waits are the timeout's
  COMM_RETURN_IF_ERROR(st);
  c->job_store->release_idle();
  COMM_INFO(kInit, "comm %s: rank %d of %d ready (transport %s)", c->id.c_str(), c->rank, c->size,
            c->transport->name());
  start_watcher(c.get());
  observe::attach(c.get());  // the metrics see it from now on (observe/live.h)
  *out = c.release();
  return Status::Ok();
}

int rank_of(comm_t c) { return c->rank; }
int size_of(comm_t c) { return c->size; }
bool aborted(comm_t c) { return c->aborted.load(std::memory_order_acquire); }
const tuning::Applied* tuning_of(comm_t c) { return c->tuning.get(); }
void record_engine_step(comm_t c, double step_us, double exposed_us, double comm_us) {
  c->stats.engine_step(step_us, exposed_us, comm_us);
}

void destroy_communicator(comm_t c) {
  observe::detach(c);  // first: no scrape reads it while it goes
  {
    std::lock_guard<std::mutex> lock(c->queue_mu);
    c->worker_stop = true;
  }
  c->queue_cv.notify_all();
  if (c->worker.joinable()) c->worker.join();  // drains: every queued call is bounded by the timeout
  // After the drain (its heartbeat keeps idle peers from taking a long drain for a stopped rank),
  // before anything goes away: it must not look at a transport that goes away.
  stop_watcher(c);
  for (auto* r : c->free_requests) delete r;
  device::release(c);  // before the transport: a graceful NCCL finalize may still need peers
  c->transport.reset();
  delete c;
}

}  // namespace comm

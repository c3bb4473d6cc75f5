// Setting the shared-memory transport up: this rank's segments, every local peer's mapped,
// then a communicator-wide store barrier that agrees on the outcome (every rank uses shm, or
// none does) before the names are unlinked.
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "log.h"
#include "params.h"
#include "shm/shm_transport_impl.h"

namespace comm::transport {
namespace shm {
namespace {

constexpr size_t kZeroCopyMin = 64 * 1024;

// Inline payload per channel slot: 64 KiB, less when many local ranks share the machine
// (every rank has a channel to every other).
size_t fragment_bytes(size_t local_size) {
  if (local_size <= 16) return 64 * 1024;
  size_t f = (size_t{1} << 20) / local_size / kPage * kPage;
  return f < kPage ? kPage : f;
}

// A barrier over the store: every rank adds itself; the last one opens the gate.
Status store_barrier(Store& store, const std::string& name, int size, Deadline deadline, const char* what) {
  int64_t arrived = 0;
  COMM_RETURN_IF_ERROR(store.add(name + "/arrived", 1, &arrived));
  if (arrived == size) return store.set(name + "/gate", "1");
  std::string ignored;
  Status st = store.get(name + "/gate", &ignored, deadline);
  if (!st.ok()) return Timeout(std::string("not every rank ") + what + " in time (" + st.message() + ")");
  return Status::Ok();
}

}  // namespace

Status ShmTransport::create_own(const std::string& secret, const std::string& comm_id) {
  const ControlGeometry& g = geometry_.control;
  COMM_RETURN_IF_ERROR(Segment::create(segment_name(secret, comm_id, rank(), 'c'), g.total(), true, &own_));
  char* base = own_.base();
  // Touched once here (MAP_POPULATE already faulted it in), all but the owner's claim that
  // create() wrote, which stays until the real magic replaces it.
  std::memset(base + sizeof(OwnerPrefix), 0, g.total() - sizeof(OwnerPrefix));
  auto* h = reinterpret_cast<ControlHeader*>(base);  // zeroed memory, as peers see it
  h->version = kLayoutVersion;
  h->pid = static_cast<int32_t>(getpid());
  h->pid_ns = pid_namespace();
  h->self_address = reinterpret_cast<uint64_t>(base);
  h->segment_bytes = g.total();
  h->comm_size = static_cast<uint32_t>(size());
  h->local_size = static_cast<uint32_t>(local_ranks_.size());
  h->local_index = static_cast<uint32_t>(me_);
  h->slot_bytes = static_cast<uint32_t>(g.slot_bytes);
  h->fragment_bytes = static_cast<uint32_t>(g.fragment_bytes);
  h->channel_slots = kChannelSlots;
  new (base + g.lines_offset()) ControlLines();
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kControlMagic;
  Peer& p = peers_[static_cast<size_t>(me_)];
  p.header = h;
  p.lines = reinterpret_cast<ControlLines*>(base + g.lines_offset());
  p.slots = base + g.slots_offset();
  p.channels = base + g.channels_offset();
  my_header_ = h;
  my_lines_ = p.lines;
  return options_.store->set("ctl/" + std::to_string(rank()), "1");
}

Status ShmTransport::map_peers(const std::string& secret, const std::string& comm_id, Store& store,
                               Deadline deadline) {
  const ControlGeometry& g = geometry_.control;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) == me_) continue;
    Peer& p = peers_[i];
    std::string value;
    Status st = store.get("ctl/" + std::to_string(p.rank), &value, deadline);
    if (!st.ok()) return Timeout(who(static_cast<int>(i)) + " did not create its shared-memory segment in time");
    if (value != "1") return SystemError(who(static_cast<int>(i)) + " could not set up shared memory");
    COMM_RETURN_IF_ERROR(Segment::open(segment_name(secret, comm_id, p.rank, 'c'), true, &p.mapping));
    auto* h = reinterpret_cast<ControlHeader*>(p.mapping.base());
    if (p.mapping.bytes() < sizeof(ControlHeader) || h->magic != kControlMagic || h->version != kLayoutVersion)
      return SystemError(who(static_cast<int>(i)) + "'s shared-memory segment is not libcomm's (magic or version)");
    if (h->segment_bytes != g.total() || h->slot_bytes != g.slot_bytes || h->fragment_bytes != g.fragment_bytes ||
        h->local_size != local_ranks_.size() || h->comm_size != static_cast<uint32_t>(size()) ||
        p.mapping.bytes() < g.total())
      return SystemError(who(static_cast<int>(i)) + " laid its shared memory out differently (slot " +
                         std::to_string(h->slot_bytes) + " bytes vs " + std::to_string(g.slot_bytes) +
                         " here): start every rank with the same COMM_SHM_SLOT_BYTES");
    p.header = h;
    p.lines = reinterpret_cast<ControlLines*>(p.mapping.base() + g.lines_offset());
    p.slots = p.mapping.base() + g.slots_offset();
    p.channels = p.mapping.base() + g.channels_offset();
  }
  return Status::Ok();
}

}  // namespace shm

Status connect_shm(const Options& options, const ShmConfig& config, std::shared_ptr<shm::Domain>* domain,
                   ShmOutcome* out) {
  using namespace shm;
  *out = ShmOutcome{};
  if (!options.store) return InvalidArgument("shm transport: no store");
  const int n = options.size;
  if (static_cast<int>(options.host_of.size()) != n)
    return Internal("shm transport: host map of " + std::to_string(options.host_of.size()) + " ranks for " +
                    std::to_string(n));
  Store& store = *options.store;
  const Deadline deadline = Deadline::after_ms(options.timeout_ms);
  const std::string label = options.comm_label + (options.comm_label.empty() ? "" : " ") + "rank " +
                            std::to_string(options.rank);
  std::vector<int> local;
  for (int r = 0; r < n; ++r)
    if (options.host_of[static_cast<size_t>(r)] == options.host_of[static_cast<size_t>(options.rank)]) local.push_back(r);
  auto world_of = [&](int r) { return config.world_ranks.empty() ? r : config.world_ranks[static_cast<size_t>(r)]; };

  // Nobody creates a segment before every rank is here: a rank killed while it waits for a
  // late or failed peer then leaves nothing behind. What is created is unlinked within the
  // setup's few milliseconds; a kill inside them leaves segments the next job removes.
  COMM_RETURN_IF_ERROR(store_barrier(store, "enter", n, deadline, "reached shared-memory setup"));
  std::string failure;
  std::unique_ptr<ShmTransport> t;
  bool created_domain = false;
  bool cma_ok = true;
  if (local.size() > 1) {
    Status st;
    int64_t slot = 0, arena = 0, cma = 0;
    st = params::get_int("COMM_SHM_SLOT_BYTES", &slot);
    if (st.ok() && options.shm_slot_bytes != 0) slot = options.shm_slot_bytes;  // the tuning profile's
    if (st.ok()) st = params::get_int("COMM_SHM_ARENA_BYTES", &arena);
    if (st.ok()) st = params::get_int("COMM_SHM_CMA", &cma);
    if (st.ok() && config.create_domain) {
      DomainConfig dc;
      dc.secret = options.secret;
      dc.world_rank = world_of(options.rank);
      for (int r : local) dc.local_world_ranks.push_back(world_of(r));
      // Domain::index_of_world searches them in order (transports/shm/domain.h, DomainConfig),
      // but a grown communicator's are not: a joiner in a dead rank's slot comes last with a
      // lower world rank (libcomm/src/grow.cc, describe; docs/design/core.md, "Growing a
      // communicator"). Unsorted, its peers found no arena for it (index -1) and refused its
      // large calls: "exposed a buffer outside its arena".
      std::sort(dc.local_world_ranks.begin(), dc.local_world_ranks.end());
      dc.arena_bytes = static_cast<size_t>(arena);
      dc.cma_allowed = cma != 0;
      dc.label = label;
      st = Domain::create(dc, store, domain);
      created_domain = st.ok();
    }
    if (st.ok() && !*domain) st = Internal("no shared-memory domain for a derived communicator");
    if (st.ok()) {
      Geometry g;
      g.control.local_size = local.size();
      g.control.slot_bytes = static_cast<size_t>(slot);
      g.control.fragment_bytes = fragment_bytes(local.size());
      // Messages that fit in a channel are copied at once (the sender's buffer is free at
      // once, as a socket's would be); larger ones are read in place, once.
      g.zero_copy_min = std::max(kZeroCopyMin, kChannelSlots * g.control.fragment_bytes + 1);
      t = std::make_unique<ShmTransport>(options, local, config.world_ranks, *domain, g);
      st = t->create_own(options.secret, config.comm_id);
    }
    if (st.ok() && created_domain) st = (*domain)->map_peers(store, deadline);
    if (st.ok()) st = t->map_peers(options.secret, config.comm_id, store, deadline);
    if (st.ok() && created_domain) cma_ok = (*domain)->cma_probe_ok();
    if (!st.ok()) failure = st.message();
  }

  // Tell the others, and keep local peers from waiting for what this rank will never create.
  if (!failure.empty()) {
    COMM_RETURN_IF_ERROR(store.set("why", "rank " + std::to_string(options.rank) + ": " + failure));
    COMM_RETURN_IF_ERROR(store.set("ctl/" + std::to_string(options.rank), "FAIL"));
    if (config.create_domain)
      COMM_RETURN_IF_ERROR(store.set("arena/" + std::to_string(world_of(options.rank)), "FAIL"));
    int64_t ignored = 0;
    COMM_RETURN_IF_ERROR(store.add("failed", 1, &ignored));
  }
  if (!cma_ok) {
    int64_t ignored = 0;
    COMM_RETURN_IF_ERROR(store.add("nocma", 1, &ignored));
  }
  Status barrier = store_barrier(store, "mapped", n, deadline, "finished setting up shared memory");
  if (t) t->unlink_own();
  if (created_domain) (*domain)->unlink_own();
  COMM_RETURN_IF_ERROR(barrier);

  int64_t failed = 0, nocma = 0;
  COMM_RETURN_IF_ERROR(store.add("failed", 0, &failed));
  COMM_RETURN_IF_ERROR(store.add("nocma", 0, &nocma));
  if (failed > 0) {
    std::string why;
    (void)store.get("why", &why, deadline);
    out->why_not = why.empty() ? "a rank could not set up shared memory" : why;
    if (config.create_domain) domain->reset();
    return Status::Ok();
  }
  if (created_domain) (*domain)->set_cma(nocma == 0);
  out->usable = true;
  out->transport = std::move(t);
  return Status::Ok();
}

Status connect_shm(const ConnectRequest& request, Connected* out) {
  ShmConfig config{request.comm_id, request.world_ranks, request.world};
  std::shared_ptr<shm::Domain> domain = std::dynamic_pointer_cast<shm::Domain>(*request.job_memory);
  ShmOutcome outcome;
  COMM_RETURN_IF_ERROR(connect_shm(request.options, config, &domain, &outcome));
  if (request.world) *request.job_memory = domain;
  out->transport = std::move(outcome.transport);
  out->usable = outcome.usable;
  out->why_not = outcome.why_not;
  return Status::Ok();
}

}  // namespace comm::transport

// TCP transport: non-blocking connections, progress driven inline by wait() with poll().
// Matching is by posting order per peer; every frame carries the OpTag, so ranks that
// disagree fail with INVALID_USAGE naming both calls instead of exchanging wrong bytes.
#include "socket/socket_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"
#include "params.h"
#include "socket/socket_transport_impl.h"

namespace comm::transport {
namespace sock {

SocketTransport::SocketTransport(Options options, int nconns, std::unique_ptr<Mesh> mesh, std::vector<MeshLink> links,
                                 Fd wake)
    : Transport(std::move(options)), nconns_(nconns), mesh_(std::move(mesh)), wake_(std::move(wake)) {
  conns_.resize(static_cast<size_t>(size()) * static_cast<size_t>(nconns_));
  for (size_t i = 0; i < conns_.size(); ++i) {
    conns_[i].peer = static_cast<int>(i) / nconns_;
    conns_[i].index = static_cast<int>(i) % nconns_;
  }
  pfds_.reserve(conns_.size() + 1);
  pfd_conn_.reserve(conns_.size() + 1);
  int64_t spin_us = 0;
  if (params::get_int("COMM_SOCKET_SPIN_US", &spin_us).ok()) spin_ = std::chrono::microseconds(spin_us);
  int64_t thread_bytes = 0;
  if (params::get_int("COMM_SOCKET_PROGRESS_THREAD_BYTES", &thread_bytes).ok())  // checked at creation
    thread_min_bytes_ = static_cast<uint64_t>(thread_bytes);
  heartbeat_ = std::chrono::milliseconds(options_.heartbeat_ms > 0 ? options_.heartbeat_ms : 0);
  heard_.assign(static_cast<size_t>(size()), Clock::time_point{});
  for (auto& link : links) install(link);
}

// A connection the mesh finished (either side dialed): parts queued while it was made go now.
void SocketTransport::install(MeshLink& link) {
  Connection& c = conn(link.peer, link.index);
  if (c.closed || c.fd.valid()) return;  // failed meanwhile; or (never) twice
  c.fd = std::move(link.fd);
  c.tls = std::move(link.tls);
  c.remote = std::move(link.remote);
  heard_[static_cast<size_t>(link.peer)] = Clock::now();  // silence is counted from here
  ++moved_;  // a finished handshake is progress
  if (!c.sends.empty()) send_progress(c);
}

// Every connection to a peer that could not be connected fails with the reason; waits on that
// peer then say so (check_peers), naming it.
void SocketTransport::unreachable(const MeshFailure& f) {
  for (int k = 0; k < nconns_; ++k) {
    Connection& c = conn(f.peer, k);
    if (!c.fd.valid()) {
      close_connection(c, f.reason, f.is_exit);
      c.close_is_network = f.unreachable;
    }
  }
}

void SocketTransport::abort() {
  aborted_.store(true, std::memory_order_release);
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0) {
    // Only fails when the counter would overflow: it is already signalled.
  }
}

// ---- requests --------------------------------------------------------------------------------

Status SocketTransport::usable() {
  if (aborted_.load(std::memory_order_acquire) && failed_.code() != COMM_ERR_ABORTED) {
    if (failed_.ok()) failed_at_ = Clock::now();
    failed_ = Aborted(me() + ": the transport was aborted (comm_abort); make a new communicator");
  }
  return failed_;
}

void SocketTransport::push(PartQueue& q, PartLink link) {
  part(link).next = kNil;
  if (q.tail == kNil)
    q.head = link;
  else
    part(q.tail).next = link;
  q.tail = link;
}

PartLink SocketTransport::pop(PartQueue& q) {
  PartLink link = q.head;
  q.head = part(link).next;
  if (q.head == kNil) q.tail = kNil;
  return link;
}

Status SocketTransport::post_request(const Post& call, RequestId* id) {
  Entry entry(*this);
  COMM_RETURN_IF_ERROR(usable());
  const auto [is_send, peer, tag, buf, bytes] = call;
  uint32_t index;
  COMM_RETURN_IF_ERROR(pool_.acquire(&index, id));
  Request& r = pool_[index];
  r.is_send = is_send;
  r.peer = peer;
  r.tag = tag;
  r.buf = buf;
  r.bytes = bytes;
  r.any = false;
  r.flowing = false;
  r.waiting = 0;
  return place(index);
}

Status SocketTransport::place(uint32_t index) {
  Request& r = pool_[index];
  const bool is_send = r.is_send;
  const int peer = r.peer;
  const uint64_t bytes = r.bytes;
  int n = stripe_parts(bytes, nconns_);
  r.nparts = static_cast<uint8_t>(n);
  r.parts_left = static_cast<uint8_t>(n);
  r.large = thread_min_bytes_ != 0 && bytes >= thread_min_bytes_;
  if (r.large) {
    ++open_large_;
    start_progress_thread();
  }
  for (int k = 0; k < n; ++k) {
    Part& p = r.parts[k];
    stripe_part(bytes, n, k, &p.offset, &p.length);
    p.done = 0;
    p.finished = false;
  }

  // First use of this peer (or of a connection only striped messages use): dialed now, made by
  // progress; parts queue on them meanwhile.
  if (mesh_ && !conn(peer, n - 1).fd.valid()) mesh_->want(peer, n);
  for (int k = 0; k < n; ++k) {
    PartLink link = index * kMaxConns + static_cast<uint32_t>(k);
    Connection& c = conn(peer, k);
    if (is_send) {
      bool idle = c.sends.empty();
      push(c.sends, link);
      if (idle && !c.closed && c.fd.valid()) send_progress(c);  // eager: small messages leave before wait()
    } else {
      push(c.receives, link);
      if (c.state == RecvState::kStashed && c.receives.head == link) {
        Status st = match(c);
        if (!st.ok()) return fail(st);
      }
    }
  }
  return Status::Ok();
}

Status SocketTransport::post_any(const OpTag& tag, const uint64_t* next_seq, void* buf, size_t bytes, int* source,
                                RequestId* id) {
  Entry entry(*this);
  COMM_RETURN_IF_ERROR(usable());
  uint32_t index;
  COMM_RETURN_IF_ERROR(pool_.acquire(&index, id));
  Request& r = pool_[index];
  r.is_send = false;
  r.peer = -1;
  r.tag = tag;
  r.buf = static_cast<char*>(buf);
  r.bytes = bytes;
  r.nparts = 0;
  r.parts_left = 1;  // unfinished until it matched and its parts arrived
  r.large = false;
  r.flowing = false;
  r.waiting = 0;
  r.any = true;
  r.source = source;
  r.next_seq = next_seq;
  any_recvs_.push(pool_, index);
  Status st = match_any();  // a message may be stashed already
  return st.ok() ? st : fail(st);
}

// Every message has its first part on connection #0, so a DATA header stashed there with no
// receive queued is the peer's next message, unclaimed; a receive from any rank takes it (the
// core posts no receive after one from any rank until it completes, so this is MPI's order).
// Peers are asked in turn (transports/common/any_source.h).
int SocketTransport::find_any() {
  return next_peer_in_turn(size(), rank(), &any_turn_, [this](int peer) {
    const Connection& c = conn(peer, 0);
    return !c.closed && c.state == RecvState::kStashed && c.receives.empty() &&
           c.recv_hdr.coll == static_cast<uint8_t>(CollKind::kSendRecv);  // never a collective's
  });
}

Status SocketTransport::probe_any(int* source) {
  Entry entry(*this);
  COMM_RETURN_IF_ERROR(usable());
  if (source == nullptr) return InvalidArgument("socket transport: null source pointer for a probe");
  if (Status st = take_thread_failure(); !st.ok()) return fail(st);
  Status st = progress(0);  // reads the headers that arrived
  if (st.ok()) st = report_for(kAnyOrder);  // a probe is for a receive from any rank: any report ends it
  if (!st.ok()) return fail(st);
  COMM_RETURN_IF_ERROR(usable());
  *source = find_any();
  return Status::Ok();
}

Status SocketTransport::match_any() {
  // place() matches the stashed header: checked as irecv() checks it.
  return match_any_source(any_recvs_, pool_, [this] { return find_any(); },
                          [this](uint32_t index) { return place(index); });
}

// A peer we still need bytes from (or must send bytes to) whose connection is gone.
Status SocketTransport::check_peers(Request& r) {
  for (int k = 0; k < r.nparts; ++k) {
    if (r.parts[k].finished) continue;
    const Connection& c = conn(r.peer, k);
    if (!c.closed) continue;
    const std::string text = "rank " + std::to_string(r.peer) + " " + c.close_reason + " during " + describe(r.tag) +
                             (c.close_is_exit ? " (did it exit or crash?)" : "");
    return c.close_is_network ? SystemError(text) : RemoteError(text);
  }
  return Status::Ok();
}

Status SocketTransport::wait(const RequestId* ids, size_t n) { return drive(ids, n, false); }

Status SocketTransport::wait_some(const RequestId* ids, size_t n) { return drive(ids, n, true); }

void SocketTransport::wake() {
  woken_.store(true, std::memory_order_release);
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0) {
    // Only fails when the counter would overflow: it is already signalled.
  }
}

Status SocketTransport::drive(const RequestId* ids, size_t n, bool any) {
  Entry entry(*this);
  COMM_RETURN_IF_ERROR(usable());
  COMM_RETURN_IF_ERROR(pool_.lookup_all(ids, n));
  // A failure names the peers this wait still needed (Transport::wait_failure).
  auto failed = [&](const Status& st) {
    for (size_t i = 0; i < n; ++i) {
      const Request& r = pool_.of(ids[i]);
      if (r.parts_left > 0 && !r.any) note_awaited(st, r.peer, r.tag);
    }
    seal_wait_failure(st);
    return fail(st);
  };
  ProgressClock clock(options_.timeout_ms, spin_);
  // Per-peer waits over the whole call (common/arrivals.h): the stretch since the last look is
  // charged to the peers whose receives that look found unfinished. Only a wait that blocked
  // reads the clock for it, once per wake-up.
  Arrivals* const charge = arrivals();
  Clock::time_point last_look{};
  bool charging = false;
  for (;;) {
    if (Status st = take_thread_failure(); !st.ok()) return failed(st);
    Clock::time_point now{};
    if (charging) now = Clock::now();
    bool all_done = true, some_done = false, waiting = false;
    for (size_t i = 0; i < n; ++i) {
      Request& r = pool_.of(ids[i]);
      if (charging && r.waiting != 0)
        charge->waited(r.peer, static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   now - last_look).count()), r.waiting == 2);
      r.waiting = 0;
      // A kept report fails the operation it names even where this rank's part of it is done.
      Status st = report_for_request(r);
      if (st.ok() && r.parts_left > 0) st = check_peers(r);
      if (!st.ok()) return failed(st);
      if (r.parts_left == 0) {
        some_done = true;
        continue;
      }
      all_done = false;
      if (charge != nullptr && !r.is_send && r.peer >= 0) {
        r.waiting = r.flowing ? 2 : 1;
        waiting = true;
      }
    }
    if (all_done && !any) break;
    if (any && (some_done || n == 0 || woken_.exchange(false, std::memory_order_acq_rel))) return Status::Ok();
    if (aborted_.load(std::memory_order_acquire)) return usable();
    if (!charging) now = Clock::now();
    charging = waiting;
    last_look = now;
    if (clock.expired(now)) return failed(Timeout(timeout_message(ids, n)));
    if (!clock.spinning(now)) {
      if (Status st = silent_awaited(ids, n, now); !st.ok()) return failed(st);
    }
    if (heartbeat_.count() != 0 && now >= next_beat_) beat(now);  // peers that idle hear this rank lives
    int poll_ms = clock.spinning(now) ? 0 : clock.block_ms(now, kMaxBlockMs);
    uint64_t before = moved_;
    Status st = progress(poll_ms);
    if (!st.ok()) return failed(st);
    if (moved_ != before) clock.moved();
  }
  pool_.release_all(ids, n);
  return Status::Ok();
}

Status SocketTransport::test(RequestId id, bool* done) {
  Entry entry(*this);
  COMM_RETURN_IF_ERROR(usable());
  if (done == nullptr) return InvalidArgument("socket transport: null done pointer");
  uint32_t index;
  COMM_RETURN_IF_ERROR(pool_.lookup(id, &index));
  Request& r = pool_[index];
  if (Status st = take_thread_failure(); !st.ok()) {  // as drive() reports it: naming whom it needed
    if (r.parts_left > 0 && !r.any) note_awaited(st, r.peer, r.tag);
    seal_wait_failure(st);
    return fail(st);
  }
  if (r.parts_left > 0) {
    Status st = progress(0);
    if (!st.ok()) return fail(st);
    COMM_RETURN_IF_ERROR(usable());
  }
  Status st = report_for_request(r);
  if (st.ok() && r.parts_left > 0) st = check_peers(r);
  if (!st.ok()) return fail(st);
  *done = r.parts_left == 0;
  if (*done) pool_.release(index);
  return Status::Ok();
}

// An awaited peer silent past the silence rule (no byte, not even a heartbeat: a live peer is
// heard every COMM_HEARTBEAT_MS, also while it waits or computes) is stopped or hung; the wait
// fails now, also one that began after the peer fell silent. Before, such a wait ran its own
// whole timeout: in a 4x2 chaos run a rank behind the others in the engine's buckets began
// waiting on a SIGSTOPped rank 10 s after the stop, and the survivors' agreement waited for it.
// Judged as idle detection judges it (heartbeat.cc, silence_of).
Status SocketTransport::silent_awaited(const RequestId* ids, size_t n, Clock::time_point now) {
  for (size_t i = 0; i < n; ++i) {
    const Request& r = pool_.of(ids[i]);
    if (r.parts_left == 0 || r.any || r.peer < 0 || r.peer == rank()) continue;
    const int64_t silent = silence_of(r.peer, now);
    if (silent < silence_limit_ms()) continue;
    return Timeout("rank " + std::to_string(r.peer) + " sent nothing, not even a heartbeat (every " +
                   std::to_string(heartbeat_.count()) + " ms, COMM_HEARTBEAT_MS), for " + std::to_string(silent) +
                   " ms (COMM_TIMEOUT_MS " + std::to_string(options_.timeout_ms) + ") while rank " +
                   std::to_string(rank()) + " waited on it in " + describe(r.tag) +
                   "; is it stopped (SIGSTOP, a debugger) or hung?");
  }
  return Status::Ok();
}

std::string SocketTransport::timeout_message(const RequestId* ids, size_t n) {
  std::string text = "no progress for " + std::to_string(options_.timeout_ms) + " ms (COMM_TIMEOUT_MS) while rank " +
                     std::to_string(rank()) + " waited on ";
  std::string parts;
  for (size_t i = 0; i < n; ++i) {
    Request& r = pool_.of(ids[i]);
    if (r.parts_left == 0) continue;
    if (r.any) {
      const std::string one = "any rank (receive from any source, COMM_ANY_SOURCE, of " + std::to_string(r.bytes) +
                              " bytes: no rank sent a message)";
      if (parts.find(one) == std::string::npos) parts += (parts.empty() ? "" : "; ") + one;
      continue;
    }
    uint64_t moved = 0;
    for (int k = 0; k < r.nparts; ++k) {
      uint64_t d = r.parts[k].done;
      moved += r.is_send ? (d > kHeaderBytes ? d - kHeaderBytes : 0) : d;
    }
    std::string one = "rank " + std::to_string(r.peer) + " (" + (r.is_send ? "send of " : "receive of ") +
                      describe(r.tag) + ": " + std::to_string(moved) + " of " + std::to_string(r.bytes) + " bytes)";
    if (parts.find(one) != std::string::npos) continue;
    parts += (parts.empty() ? "" : "; ") + one;
  }
  std::string unconnected;
  for (size_t i = 0; i < n && mesh_; ++i) {
    Request& r = pool_.of(ids[i]);
    if (r.parts_left == 0 || r.any || conn(r.peer, 0).fd.valid()) continue;
    std::string one = "rank " + std::to_string(r.peer) + " is not connected (" + mesh_->why_not_connected(r.peer) + ")";
    if (unconnected.find(one) == std::string::npos) unconnected += "; " + one;
  }
  return text + parts + unconnected + "; is that rank still running, and calling the same operation?";
}
}  // namespace sock

Status create_socket_transport(const Options& options, std::unique_ptr<Transport>* out) {
  using namespace sock;
  if (out == nullptr) return InvalidArgument("socket transport: null output pointer");
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size)
    return InvalidArgument("socket transport: rank " + std::to_string(options.rank) + " is not in [0, " +
                           std::to_string(options.size) + ")");
  if (options.timeout_ms <= 0)
    return InvalidArgument("socket transport: timeout_ms must be positive, got " + std::to_string(options.timeout_ms));
  if (options.size > 1 && !options.store) return InvalidArgument("socket transport: no store to exchange addresses");
  std::string me = options.comm_label + (options.comm_label.empty() ? "" : " ") + "rank " + std::to_string(options.rank);

  int64_t nconns = 0;
  COMM_RETURN_IF_ERROR(params::get_int("COMM_SOCKET_NCONNS", &nconns));  // 1..kMaxConns (params.cc)
  if (options.socket_nconns != 0) nconns = options.socket_nconns;  // the tuning profile's (validated 1..8)
  Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return SystemError(me + ": socket transport: eventfd() failed: " + errno_string(errno));

  int64_t eager = 0, thread_bytes = 0;
  COMM_RETURN_IF_ERROR(params::get_int("COMM_SOCKET_EAGER", &eager));
  COMM_RETURN_IF_ERROR(params::get_int("COMM_SOCKET_PROGRESS_THREAD_BYTES", &thread_bytes));
  std::vector<MeshLink> links;
  std::unique_ptr<Mesh> mesh;
  if (options.size > 1) {
    // The interface is the core's choice (topology/interfaces.h); a transport made without
    // one, every rank on this host, stays on loopback.
    ListenAddress listen = options.listen;
    if (listen.addresses.empty()) {
      if (!options.all_local)
        return InvalidArgument(me + ": socket transport: no interface to listen on (Options.listen is empty and "
                               "ranks are on several hosts)");
      listen = {{{"lo", "127.0.0.1", AF_INET}}, "all ranks on one host: loopback", ""};
    }
    std::string where;
    for (const auto& a : listen.addresses) where += (where.empty() ? "" : ", ") + a.ifname + " " + a.address;
    COMM_INFO(kNet, "%s: %s; listening on %s", me.c_str(), listen.why.c_str(), where.c_str());
    int connect_timeout_ms = 0;
    COMM_RETURN_IF_ERROR(params::socket_connect_timeout_ms(&connect_timeout_ms));

    MeshConfig config;
    config.rank = options.rank;
    config.size = options.size;
    config.nconns = static_cast<int>(nconns);
    config.timeout_ms = options.timeout_ms;
    config.secret = options.secret;
    config.label = options.comm_label;
    config.store = options.store.get();
    config.listen = listen.addresses;
    config.host_of = options.host_of;
    config.connect_timeout_ms = connect_timeout_ms;
    config.route_ifname = listen.route_ifname;
    config.tls = options.tls;
    config.arrivals = options.arrivals;
    mesh = std::make_unique<Mesh>(config);
    if (options.early && !options.early->fds.empty())
      COMM_RETURN_IF_ERROR(mesh->adopt(std::move(options.early->fds), options.early->table));
    else
      COMM_RETURN_IF_ERROR(mesh->start());
    if (eager != 0) COMM_RETURN_IF_ERROR(mesh->connect_all(&links));
  }
  out->reset(new SocketTransport(options, static_cast<int>(nconns), std::move(mesh), std::move(links),
                                 std::move(wake)));
  return Status::Ok();
}

}  // namespace comm::transport

// UCX transport setup and teardown: a UCP context and worker per transport (tag matching and
// wakeup), the worker's address published in the communicator's store, an endpoint per peer
// with UCX's peer-failure handling, so a dead peer ends waits with COMM_ERR_REMOTE.
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "hash.h"
#include "log.h"
#include "ucx/ucx_transport.h"
#include "ucx/ucx_transport_impl.h"

namespace comm::transport {
namespace ucx {
namespace {

std::string hex(const void* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(digits[p[i] >> 4]);
    out.push_back(digits[p[i] & 15]);
  }
  return out;
}

bool unhex(const std::string& text, std::vector<unsigned char>* out) {
  if (text.size() % 2 != 0) return false;
  auto value = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  out->resize(text.size() / 2);
  for (size_t i = 0; i < out->size(); ++i) {
    int hi = value(text[2 * i]), lo = value(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

// FNV-1a of the job secret: every header carries it, so a stray sender from another job is
// refused. Sent in clear, it is no secret and proves nothing to someone who reads the wire
// (transports/ucx/README.md).
uint64_t job_key(const std::string& secret) {
  return fnv1a(secret) | 1;
}

std::string ucs(ucs_status_t s) { return ucx_library().ucs_status_string(s); }

std::string pid_namespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? std::to_string(st.st_ino) : "?";
}

}  // namespace

UcxTransport::UcxTransport(Options options) : Transport(std::move(options)) {
  key_ = job_key(options_.secret);
  // Touched once here, reused for every message.
  for (uint32_t i = 0; i < decltype(pool_)::kSize; ++i)
    for (Part& p : pool_[i].parts) {
      p.owner = this;
      p.request = i;
    }
  report_part_.owner = this;
  peers_.resize(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) {
    peers_[static_cast<size_t>(r)].owner = this;
    peers_[static_cast<size_t>(r)].rank = r;
  }
}

// Setup in named steps: the worker, the failure-report receive, then (more than one rank) the
// address exchange and an endpoint to every peer, wired up while every rank is here.
Status UcxTransport::setup() {
  COMM_RETURN_IF_ERROR(create_worker());
  COMM_RETURN_IF_ERROR(post_report_receive());
  if (size() == 1) return Status::Ok();
  if (size() > kMaxRanks)
    return InvalidArgument("UCX transport: " + std::to_string(size()) + " ranks; at most " +
                           std::to_string(kMaxRanks) + " fit in its tags");
  COMM_RETURN_IF_ERROR(publish_address());
  const Deadline deadline = Deadline::after_ms(options_.timeout_ms);
  for (int r = 0; r < size(); ++r)
    if (r != rank()) COMM_RETURN_IF_ERROR(connect_peer(r, deadline));
  COMM_RETURN_IF_ERROR(connect_all(deadline));
  std::string tls;
  if (const char* v = getenv("UCX_TLS")) tls = v;
  unsigned major = 0, minor = 0, release = 0;
  ucx_library().ucp_get_version(&major, &minor, &release);
  COMM_INFO(kNet, "%s: UCX %u.%u.%u, %d endpoints, UCX_TLS=%s, waits %s", me().c_str(), major, minor, release,
            size() - 1, tls.empty() ? "(UCX's choice)" : tls.c_str(),
            worker_fd_ >= 0 ? "block on the worker's event fd" : "nap");
  return Status::Ok();
}

Status UcxTransport::create_worker() {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return SystemError(me() + ": UCX transport: eventfd() failed: " + errno_string(errno));

  ucp_config_t* config = nullptr;  // UCX_* from the environment (UCX_TLS, UCX_NET_DEVICES, ...)
  ucs_status_t s = ucx_library().ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return Unavailable(me() + ": UCX transport: ucp_config_read failed: " + ucs(s) + "; check UCX_* variables");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  s = ucx_library().ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &context_);
  ucx_library().ucp_config_release(config);
  if (s != UCS_OK)
    return Unavailable(me() + ": UCX transport: ucp_init failed: " + ucs(s) +
                       " (no usable UCX transport here? check UCX_TLS and `ucx_info -d`)");

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // The application thread and the communicator's worker take turns, never at once.
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  s = ucx_library().ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) return Unavailable(me() + ": UCX transport: ucp_worker_create failed: " + ucs(s));
  s = ucx_library().ucp_worker_get_efd(worker_, &worker_fd_);
  if (s != UCS_OK) {
    worker_fd_ = -1;  // waits then nap instead of blocking on the fd
    COMM_WARN(kNet, "%s: UCX worker has no event fd (%s): waits poll with short naps", me().c_str(), ucs(s).c_str());
  }
  return Status::Ok();
}

// Where a peer's failure report lands: any source, posted for the transport's whole life.
Status UcxTransport::post_report_receive() {
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  rp.cb.recv = &UcxTransport::on_error_report;
  rp.user_data = &report_part_;
  void* req = ucx_library().ucp_tag_recv_nbx(worker_, &report_, sizeof report_, kErrorBit, kErrorBit, &rp);
  if (UCS_PTR_IS_ERR(req))
    return Internal(me() + ": UCX transport: posting the failure-report receive failed: " + ucs(UCS_PTR_STATUS(req)));
  report_part_.ucp = req;
  report_part_.pending = true;
  return Status::Ok();
}

Status UcxTransport::publish_address() {
  ucp_address_t* address = nullptr;
  size_t address_len = 0;
  ucs_status_t s = ucx_library().ucp_worker_get_address(worker_, &address, &address_len);
  if (s != UCS_OK) return Internal(me() + ": UCX transport: ucp_worker_get_address failed: " + ucs(s));
  // The address, and this process's pid and pid namespace: a peer reached only over shared
  // memory (no UCX failure detection there) is checked for death by its pid.
  const std::string mine = hex(address, address_len) + "|" + std::to_string(::getpid()) + "|" + pid_namespace();
  ucx_library().ucp_worker_release_address(worker_, address);
  return options_.store->set("ucx/addr/" + std::to_string(rank()), mine);
}

// Rank r's published address, then an endpoint to it (with peer-failure handling where UCX has it).
Status UcxTransport::connect_peer(int r, const Deadline& deadline) {
  std::vector<unsigned char> remote;
  std::string text;
  Status st = options_.store->get("ucx/addr/" + std::to_string(r), &text, deadline);
  if (!st.ok())
    return Timeout(me() + ": UCX transport: rank " + std::to_string(r) + " did not publish its UCX address within " +
                   std::to_string(options_.timeout_ms) + " ms (is it running, with COMM_TRANSPORT=ucx too?)");
  const size_t bar = text.find('|');
  const size_t bar2 = bar == std::string::npos ? bar : text.find('|', bar + 1);
  if (bar2 == std::string::npos || !unhex(text.substr(0, bar), &remote) || remote.empty())
    return RemoteError(me() + ": UCX transport: rank " + std::to_string(r) + " published a malformed UCX address");
  Peer& peer = peers_[static_cast<size_t>(r)];
  if (text.substr(bar2 + 1) == pid_namespace()) peer.pid = atoi(text.substr(bar + 1, bar2 - bar - 1).c_str());
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(remote.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;  // a dead peer fails its endpoint instead of hanging it
  ep.err_handler.cb = &UcxTransport::on_peer_failure;
  ep.err_handler.arg = &peer;
  ucs_status_t s = ucx_library().ucp_ep_create(worker_, &ep, &peer.ep);
  if (s == UCS_ERR_UNREACHABLE) {
    // UCX 1.13 offers no peer-failure handling over shared memory alone (UCX_TLS=posix/sysv):
    // connect without it, and watch that peer's pid instead (same host, same pid namespace).
    ep.field_mask &= ~static_cast<uint64_t>(UCP_EP_PARAM_FIELD_ERR_HANDLER);
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    s = ucx_library().ucp_ep_create(worker_, &ep, &peer.ep);
    if (s == UCS_OK) {
      peer.watch_pid = peer.pid > 0;
      // A pidfd sees the exit at once; kill(pid, 0) only once the parent reaped the process
      // (as shm/domain.cc does; kernels before 5.3 fall back to kill).
      if (peer.watch_pid) peer.pidfd = static_cast<int>(syscall(SYS_pidfd_open, peer.pid, 0));
      COMM_INFO(kNet, "%s: UCX endpoint to rank %d has no failure handling on these transports; %s", me().c_str(), r,
                peer.watch_pid ? "its pid is watched instead" : "a dead peer shows as a timeout");
    }
  }
  if (s != UCS_OK)
    return SystemError(me() + ": UCX transport: connecting to rank " + std::to_string(r) + " failed: " + ucs(s) +
                       " (do both hosts share a UCX transport? see UCX_TLS and `ucx_info -d`)");
  return Status::Ok();
}

// UCX connects an endpoint on first use, which needs both sides to progress. Done here, while
// every rank is in setup: flush each endpoint (it completes once the endpoint is wired up), then
// keep progressing until every rank has, so no rank leaves while a peer still needs its answer.
// Afterwards a message (a failure report above all) leaves at once, without waiting for a peer.
Status UcxTransport::connect_all(const Deadline& deadline) {
  std::vector<void*> flushes;
  for (Peer& p : peers_) {
    if (p.ep == nullptr) continue;
    ucp_request_param_t rp{};
    void* req = ucx_library().ucp_ep_flush_nbx(p.ep, &rp);
    if (UCS_PTR_IS_ERR(req))
      return SystemError(me() + ": UCX transport: connecting to rank " + std::to_string(p.rank) +
                         " failed: " + ucs(UCS_PTR_STATUS(req)));
    if (req != nullptr) flushes.push_back(req);
  }
  for (void* req : flushes) {
    while (ucx_library().ucp_request_check_status(req) == UCS_INPROGRESS && !deadline.expired()) ucx_library().ucp_worker_progress(worker_);
    const ucs_status_t s = ucx_library().ucp_request_check_status(req);
    ucx_library().ucp_request_free(req);
    if (s == UCS_INPROGRESS)
      return Timeout(me() + ": UCX transport: endpoints not connected within " + std::to_string(options_.timeout_ms) +
                     " ms (are all ranks running, and do their hosts share a UCX transport? see UCX_TLS)");
    if (s != UCS_OK) return SystemError(me() + ": UCX transport: connecting to a peer failed: " + ucs(s));
  }
  int64_t ready = 0;
  COMM_RETURN_IF_ERROR(options_.store->add("ucx/connected", 1, &ready));
  auto next_look = Clock::now();
  while (ready < size()) {
    if (ucx_library().ucp_worker_progress(worker_) == 0) {
      timespec nap{0, 20 * 1000};  // ranks may outnumber cores: leave them the CPU
      nanosleep(&nap, nullptr);
    }
    if (Clock::now() < next_look) continue;
    if (deadline.expired())
      return Timeout(me() + ": UCX transport: only " + std::to_string(ready) + " of " + std::to_string(size()) +
                     " ranks connected their UCX endpoints within " + std::to_string(options_.timeout_ms) + " ms");
    COMM_RETURN_IF_ERROR(options_.store->add("ucx/connected", 0, &ready));
    next_look = Clock::now() + std::chrono::microseconds(200);
  }
  return Status::Ok();
}

void UcxTransport::abort() {
  aborted_.store(true, std::memory_order_release);
  uint64_t one = 1;
  if (wake_fd_ >= 0 && ::write(wake_fd_, &one, sizeof one) < 0) {
    // Only fails when the counter would overflow: it is already signalled.
  }
}

void UcxTransport::wake() {
  woken_.store(true, std::memory_order_release);
  uint64_t one = 1;
  if (wake_fd_ >= 0 && ::write(wake_fd_, &one, sizeof one) < 0) {
    // As in abort().
  }
}

// Pending receives would otherwise write into buffers their owners free next.
void UcxTransport::cancel_pending() {
  auto cancel = [&](Part& p) {
    if (p.pending && p.ucp != nullptr) ucx_library().ucp_request_cancel(worker_, p.ucp);
  };
  for (uint32_t i = 0; i < decltype(pool_)::kSize; ++i)
    if (pool_.active(i))
      for (Part& p : pool_[i].parts) cancel(p);
  cancel(report_part_);
  const Deadline deadline = Deadline::after_ms(1000);
  auto any_pending = [&] {
    if (report_part_.pending) return true;
    for (uint32_t i = 0; i < decltype(pool_)::kSize; ++i)
      if (pool_.active(i))
        for (Part& p : pool_[i].parts)
          if (p.pending) return true;
    return false;
  };
  while (any_pending() && !deadline.expired()) ucx_library().ucp_worker_progress(worker_);
}

// Healthy: flush the worker first, so what this rank sent (completed locally, maybe still in a
// transport's buffers) reaches its peers; then close every endpoint without a handshake, which
// would need each peer to be progressing right now. Bounded either way.
void UcxTransport::close_endpoints() {
  const Deadline deadline = Deadline::after_ms(std::min(options_.timeout_ms, 5000));
  if (failed_.ok() && !aborted_.load(std::memory_order_acquire)) {
    ucp_request_param_t rp{};
    void* req = ucx_library().ucp_worker_flush_nbx(worker_, &rp);
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
      while (ucx_library().ucp_request_check_status(req) == UCS_INPROGRESS && !deadline.expired()) ucx_library().ucp_worker_progress(worker_);
      ucx_library().ucp_request_free(req);
    }
  }
  std::vector<void*> closing;
  for (Peer& p : peers_) {
    if (p.ep == nullptr) continue;
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucx_library().ucp_ep_close_nbx(p.ep, &rp);
    p.ep = nullptr;
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) closing.push_back(req);
  }
  for (void* req : closing) {
    while (ucx_library().ucp_request_check_status(req) == UCS_INPROGRESS && !deadline.expired()) ucx_library().ucp_worker_progress(worker_);
    ucx_library().ucp_request_free(req);  // one still in flight is released by UCX once it completes
  }
}

// comm_destroy, healthy: a GOODBYE report to every live peer, so that peers which idle take
// this endpoint's failure and this process's exit for a departure (check_idle). close_endpoints'
// flush delivers them; the requests are freed after it.
void UcxTransport::say_goodbye(std::vector<void*>* sends) {
  if (!failed_.ok() || aborted_.load(std::memory_order_acquire)) return;
  outgoing_.header = WireHeader{};
  outgoing_.header.key = key_;
  outgoing_.header.status = kGoodbye;
  outgoing_.header.source = rank();
  for (Peer& p : peers_) {
    if (p.ep == nullptr || p.failed || p.left) continue;
    ucp_request_param_t rp{};
    void* req = ucx_library().ucp_tag_send_nbx(p.ep, &outgoing_, sizeof(WireHeader),
                                               kErrorBit | (static_cast<uint64_t>(rank()) << kRankShift), &rp);
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) sends->push_back(req);
  }
}

UcxTransport::~UcxTransport() {
  if (worker_ != nullptr) {
    std::vector<void*> goodbyes;
    say_goodbye(&goodbyes);
    cancel_pending();
    close_endpoints();
    for (void* req : goodbyes) ucx_library().ucp_request_free(req);  // one still in flight: UCX frees it later
    ucx_library().ucp_worker_destroy(worker_);
  }
  if (context_ != nullptr) ucx_library().ucp_cleanup(context_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  for (Peer& p : peers_)
    if (p.pidfd >= 0) ::close(p.pidfd);
}

}  // namespace ucx

// Built with UCX's headers; usable when its library loads here (ucx_library.cc).
bool ucx_built() { return ucx_library().usable(); }
std::string ucx_why_not() { return ucx_library().why_not; }

Status create_ucx_transport(const Options& options, std::unique_ptr<Transport>* out) {
  if (out == nullptr) return InvalidArgument("UCX transport: null output pointer");
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size)
    return InvalidArgument("UCX transport: rank " + std::to_string(options.rank) + " is not in [0, " +
                           std::to_string(options.size) + ")");
  if (options.timeout_ms <= 0)
    return InvalidArgument("UCX transport: timeout_ms must be positive, got " + std::to_string(options.timeout_ms));
  if (options.size > 1 && !options.store) return InvalidArgument("UCX transport: no store to exchange addresses");
  if (!ucx_library().usable()) return Unavailable("rank " + std::to_string(options.rank) + ": " + ucx_library().why_not);
  auto t = std::make_unique<ucx::UcxTransport>(options);
  COMM_RETURN_IF_ERROR(t->setup());
  *out = std::move(t);
  return Status::Ok();
}

}  // namespace comm::transport

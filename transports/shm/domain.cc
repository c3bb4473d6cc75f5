#include "shm/domain.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "log.h"
#include "shm/layout.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace comm::transport::shm {
namespace {

constexpr size_t kMinArena = size_t{1} << 30;
constexpr int kNoPidfd = -1;
constexpr int kUseKill = -2;  // kernel without pidfd_open: kill(pid, 0)

uint64_t probe_value(int world_rank) { return 0x70726f6265000000ull ^ static_cast<uint64_t>(world_rank); }

std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
// Domains with live allocations, kept alive by them.
std::vector<std::shared_ptr<Domain>>& registry() {
  static auto* live = new std::vector<std::shared_ptr<Domain>>;  // never destroyed: used at exit
  return *live;
}

}  // namespace

Domain::~Domain() {
  for (auto& p : peers_)
    if (p.pidfd >= 0) close(p.pidfd);
}

Status Domain::create(const DomainConfig& config, Store& store, std::shared_ptr<Domain>* out) {
  static const int orphans = remove_orphans();  // once per process
  static std::atomic<bool> said{false};
  if (orphans > 0 && !said.exchange(true))
    COMM_WARN(kNet, "%s: removed %d shared-memory segment(s) of ranks killed while setting up", config.label.c_str(),
              orphans);
  auto d = std::make_shared<Domain>();
  d->config_ = config;
  const std::string name = segment_name(config.secret, "0", config.world_rank, 'a');
  size_t bytes = std::max(config.arena_bytes, kMinArena);
  Status st;
  for (;;) {  // an address-space limit (ulimit -v) may refuse a large reservation: halve it
    st = Segment::create(name, bytes, false, &d->own_);
    if (st.ok() || bytes / 2 < kMinArena) break;
    bytes /= 2;
  }
  if (!st.ok()) return st.prefixed("shared-memory arena: ");
  // The header page is backed before it is written: a full /dev/shm is an error, not SIGBUS.
  if (fallocate(d->own_.fd(), 0, 0, kPage) != 0)
    return SystemError("shared-memory arena " + name + ": cannot back its first page: " + errno_string(errno) +
                       " (is /dev/shm full?)");
  auto* h = reinterpret_cast<ArenaHeader*>(d->own_.base());
  h->version = kLayoutVersion;
  h->pid = static_cast<int32_t>(getpid());
  h->self_address = reinterpret_cast<uint64_t>(d->own_.base());
  h->bytes = bytes;
  h->probe_word = probe_value(config.world_rank);
  h->pid_ns = pid_namespace();
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kArenaMagic;
  d->free_[kPage] = bytes - kPage;
  COMM_RETURN_IF_ERROR(store.set("arena/" + std::to_string(config.world_rank), std::to_string(bytes)));
  *out = std::move(d);
  return Status::Ok();
}

Status Domain::map_peers(Store& store, Deadline deadline) {
  const auto& ranks = config_.local_world_ranks;
  peers_.clear();
  peers_.resize(ranks.size());
  const uint64_t my_ns = pid_namespace();
  bool cma_ok = config_.cma_allowed;
  std::string cma_why = config_.cma_allowed ? "" : "COMM_SHM_CMA=0";
  for (size_t i = 0; i < ranks.size(); ++i) {
    Peer& p = peers_[i];
    if (ranks[i] == config_.world_rank) {
      my_index_ = static_cast<int>(i);
      p.base = own_.base();
      p.bytes = own_.bytes();
      p.pid = getpid();
      p.self_address = reinterpret_cast<uint64_t>(own_.base());
      continue;
    }
    std::string value;
    Status st = store.get("arena/" + std::to_string(ranks[i]), &value, deadline);
    if (!st.ok()) return Timeout("local rank " + std::to_string(ranks[i]) + " did not create its shared-memory arena in time");
    if (value == "FAIL") return SystemError("local rank " + std::to_string(ranks[i]) + " could not create its arena");
    COMM_RETURN_IF_ERROR(Segment::open(segment_name(config_.secret, "0", ranks[i], 'a'), false, &p.mapping));
    const auto* h = reinterpret_cast<const ArenaHeader*>(p.mapping.base());
    if (p.mapping.bytes() < kPage || h->magic != kArenaMagic || h->version != kLayoutVersion)
      return SystemError("the shared-memory arena of rank " + std::to_string(ranks[i]) +
                         " is not libcomm's (wrong magic or version)");
    p.base = p.mapping.base();
    p.bytes = std::min<size_t>(p.mapping.bytes(), h->bytes);
    p.pid = h->pid;
    p.self_address = h->self_address;
    const bool same_ns = h->pid_ns == my_ns && my_ns != 0;
    if (same_ns && p.pid != getpid()) {
      long fd = syscall(SYS_pidfd_open, p.pid, 0);
      p.pidfd = fd >= 0 ? static_cast<int>(fd) : (errno == ENOSYS ? kUseKill : kNoPidfd);
    }
    if (cma_ok && !same_ns) {
      cma_ok = false;
      cma_why = "rank " + std::to_string(ranks[i]) + " is in another pid namespace";
    }
    if (cma_ok) {
      uint64_t got = 0;
      Status rd = cma_read(static_cast<int>(i), h->self_address + offsetof(ArenaHeader, probe_word), &got, sizeof got);
      if (!rd.ok() || got != probe_value(ranks[i])) {
        cma_ok = false;
        cma_why = rd.ok() ? "it read the wrong bytes" : rd.message();
      }
    }
  }
  cma_probe_ok_ = cma_ok && ranks.size() > 1;
  if (ranks.size() > 1)
    COMM_INFO(kNet, "%s: large messages between local ranks: %s%s%s", config_.label.c_str(),
              cma_ok ? "single copy (process_vm_readv works here)"
                     : "copied in and out through shared memory (no process_vm_readv",
              cma_why.empty() ? "" : ": ", (cma_why + (cma_ok ? "" : ")")).c_str());
  return Status::Ok();
}

int Domain::index_of_world(int world_rank) const {
  const auto& ranks = config_.local_world_ranks;
  auto it = std::lower_bound(ranks.begin(), ranks.end(), world_rank);
  return it != ranks.end() && *it == world_rank ? static_cast<int>(it - ranks.begin()) : -1;
}

bool Domain::exited(int index) const {
  const Peer& p = peers_[static_cast<size_t>(index)];
  if (p.pidfd >= 0) {
    pollfd pfd{p.pidfd, POLLIN, 0};
    return poll(&pfd, 1, 0) > 0;
  }
  if (p.pidfd == kUseKill) return kill(p.pid, 0) != 0 && errno == ESRCH;
  return false;
}

Status Domain::cma_read(int index, uint64_t remote, void* dst, size_t len) const {
  const Peer& p = peers_[static_cast<size_t>(index)];
  size_t done = 0;
  while (done < len) {
    iovec local{static_cast<char*>(dst) + done, len - done};
    iovec far{reinterpret_cast<void*>(remote + done), len - done};
    ssize_t n = process_vm_readv(p.pid, &local, 1, &far, 1, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const int err = n < 0 ? errno : EFAULT;
    if (err == ESRCH) return RemoteError("its process (pid " + std::to_string(p.pid) + ") is gone");
    if (err == EFAULT) {
      char where[32];
      snprintf(where, sizeof where, "0x%llx", static_cast<unsigned long long>(remote + done));
      return RemoteError(std::string("its buffer at ") + where + " is no longer mapped (did it fail or free it?)");
    }
    return SystemError("process_vm_readv from pid " + std::to_string(p.pid) + " failed: " + errno_string(err));
  }
  return Status::Ok();
}

Status Domain::alloc(size_t bytes, char** out) {
  *out = nullptr;
  const size_t want = (bytes + kPage - 1) / kPage * kPage;
  if (want < bytes || want == 0) return InvalidArgument("cannot allocate " + std::to_string(bytes) + " bytes");
  size_t off = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(free_.begin(), free_.end(), [&](const auto& f) { return f.second >= want; });
    if (it == free_.end())
      return SystemError("the shared-memory arena (" + std::to_string(own_.bytes() >> 20) + " MiB, COMM_SHM_ARENA_BYTES) has no " +
                         std::to_string(want) + " bytes left");
    off = it->first;
    const size_t rest = it->second - want;
    free_.erase(it);
    if (rest > 0) free_[off + want] = rest;
    used_[off] = want;
  }
  char* p = own_.base() + off;
  if (fallocate(own_.fd(), 0, static_cast<off_t>(off), static_cast<off_t>(want)) != 0) {
    const int err = errno;
    free(p);
    return SystemError("cannot back " + std::to_string(want) + " bytes of shared memory: " + errno_string(err) +
                       " (/dev/shm full or too small?)");
  }
  // First touch now (page tables of this process), never inside a collective.
  if (madvise(p, want, MADV_POPULATE_WRITE) != 0) std::memset(p, 0, want);
  *out = p;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = used_.size() == 1;
  }
  if (first) {
    std::lock_guard<std::mutex> lock(registry_mu());
    registry().push_back(shared_from_this());
  }
  return Status::Ok();
}

void Domain::free(const void* p) {
  const size_t off = static_cast<size_t>(static_cast<const char*>(p) - own_.base());
  bool now_empty = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = used_.find(off);
    if (it == used_.end()) return;
    size_t len = it->second;
    used_.erase(it);
    fallocate(own_.fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(off), static_cast<off_t>(len));
    size_t start = off;
    auto next = free_.lower_bound(off);
    if (next != free_.end() && next->first == off + len) {
      len += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        len += prev->second;
        free_.erase(prev);
      }
    }
    free_[start] = len;
    now_empty = used_.empty();
  }
  if (now_empty) {
    std::shared_ptr<Domain> keep;  // dropped after the lock: it may be the last reference
    std::lock_guard<std::mutex> lock(registry_mu());
    auto& live = registry();
    for (auto it = live.begin(); it != live.end(); ++it) {
      if (it->get() == this) {
        keep = std::move(*it);
        live.erase(it);
        break;
      }
    }
  }
}

bool Domain::owns(const void* p) const {
  const char* c = static_cast<const char*>(p);
  return own_.base() != nullptr && c >= own_.base() + kPage && c < own_.base() + own_.bytes();
}

bool Domain::locate(const void* p, size_t len, uint64_t* offset) const {
  if (!owns(p)) return false;
  const size_t off = static_cast<size_t>(static_cast<const char*>(p) - own_.base());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = used_.upper_bound(off);
  if (it == used_.begin()) return false;
  --it;
  if (off + len > it->first + it->second) return false;
  *offset = off;
  return true;
}

std::shared_ptr<Domain> Domain::owner_of(const void* p) {
  std::lock_guard<std::mutex> lock(registry_mu());
  for (const auto& d : registry())
    if (d->owns(p)) return d;
  return nullptr;
}

}  // namespace comm::transport::shm

// C ABI: status strings, last error, lifecycle, requests, groups, memory.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "abi_guard.h"
#include "communicator.h"
#include "group.h"
#include "grow.h"
#include "log.h"
#include "version.h"
#include "device/device.h"

namespace comm {
namespace {
thread_local std::string t_last_error;
}  // namespace

void set_last_error(const Status& st) { t_last_error = st.message(); }

}  // namespace comm

using comm::Status;

extern "C" {

COMM_API const char* comm_status_string(comm_status_t s) {
  switch (s) {
    case COMM_OK: return "COMM_OK: no error";
    case COMM_ERR_INVALID_ARGUMENT: return "COMM_ERR_INVALID_ARGUMENT: invalid argument";
    case COMM_ERR_INVALID_USAGE: return "COMM_ERR_INVALID_USAGE: ranks disagree or call out of order";
    case COMM_ERR_SYSTEM: return "COMM_ERR_SYSTEM: operating system or network error";
    case COMM_ERR_TIMEOUT: return "COMM_ERR_TIMEOUT: timed out";
    case COMM_ERR_REMOTE: return "COMM_ERR_REMOTE: a peer failed or aborted";
    case COMM_ERR_ABORTED: return "COMM_ERR_ABORTED: communicator aborted";
    case COMM_ERR_UNAVAILABLE: return "COMM_ERR_UNAVAILABLE: backend or transport not available";
    case COMM_ERR_INTERNAL: return "COMM_ERR_INTERNAL: internal error";
  }
  return "unknown comm_status_t value";
}

COMM_API const char* comm_last_error(comm_t) { return comm::t_last_error.c_str(); }

COMM_API comm_status_t comm_get_version(int* major, int* minor) {
  return comm::guarded("comm_get_version", [&]() -> Status {
    if (major == nullptr || minor == nullptr) return comm::InvalidArgument("comm_get_version: NULL output pointer");
    *major = COMM_ABI_VERSION_MAJOR;
    *minor = COMM_ABI_VERSION_MINOR;
    return Status::Ok();
  });
}

COMM_API const char* comm_get_version_string(void) { return comm::version::text(); }

COMM_API comm_status_t comm_init(const comm_config_t* cfg, comm_t* out) {
  return comm::guarded("comm_init", [&]() -> Status {
    if (out == nullptr) return comm::InvalidArgument("comm_init: the output pointer is NULL");
    *out = nullptr;
    comm_config_t local = COMM_CONFIG_INIT;
    if (cfg != nullptr) {
      // A caller built against an older header passes a smaller struct: take what it has,
      // the rest keeps its unset value. A newer caller's extra fields are ignored.
      const size_t base = offsetof(comm_config_t, version) + sizeof(int);
      if (cfg->size < base || cfg->version < 1)
        return comm::InvalidArgument("comm_init: comm_config_t not initialised (size " + std::to_string(cfg->size) +
                                     ", version " + std::to_string(cfg->version) + "); start from COMM_CONFIG_INIT");
      std::memcpy(&local, cfg, cfg->size < sizeof local ? cfg->size : sizeof local);
      local.size = sizeof local;
    }
    Status st = comm::init_communicator(local, out);
    if (!st.ok()) return st.prefixed("comm_init: ");
    return st;
  });
}

COMM_API comm_status_t comm_rank(comm_t c, int* rank) {
  return comm::guarded("comm_rank", [&]() -> Status {
    if (c == nullptr || rank == nullptr) return comm::InvalidArgument("comm_rank: NULL communicator or output pointer");
    *rank = c->rank;
    return Status::Ok();
  });
}

COMM_API comm_status_t comm_size(comm_t c, int* size) {
  return comm::guarded("comm_size", [&]() -> Status {
    if (c == nullptr || size == nullptr) return comm::InvalidArgument("comm_size: NULL communicator or output pointer");
    *size = c->size;
    return Status::Ok();
  });
}

COMM_API comm_status_t comm_dup(comm_t c, comm_t* out) {
  return comm::guarded("comm_dup", [&]() -> Status {
    if (c == nullptr || out == nullptr) return comm::InvalidArgument("comm_dup: NULL communicator or output pointer");
    *out = nullptr;
    COMM_RETURN_IF_ERROR(comm::check_usable(c));
    std::string id = c->id + ".d" + std::to_string(++c->children);
    std::vector<int> members(static_cast<size_t>(c->size));
    for (int r = 0; r < c->size; ++r) members[static_cast<size_t>(r)] = r;
    return comm::create_child(c, id, c->rank, members, out).prefixed("comm_dup: ");
  });
}

COMM_API comm_status_t comm_split(comm_t c, int color, int key, comm_t* out) {
  return comm::guarded("comm_split", [&]() -> Status {
    if (c == nullptr || out == nullptr) return comm::InvalidArgument("comm_split: NULL communicator or output pointer");
    *out = nullptr;
    if (color < 0 && color != COMM_UNSET)
      return comm::InvalidArgument("comm_split: color " + std::to_string(color) +
                                   " is negative; use a color >= 0, or COMM_UNSET to take no part");
    // Every rank learns every (color, key) through an all-gather on the parent.
    std::vector<int32_t> mine = {color, key};
    std::vector<int32_t> all(2 * static_cast<size_t>(c->size));
    comm::algo::CollArgs args;
    args.kind = comm::transport::CollKind::kAllgather;
    args.sendbuf = mine.data();
    args.recvbuf = all.data();
    args.count = 2;
    args.dtype = COMM_INT32;
    COMM_RETURN_IF_ERROR(comm::run_blocking(c, args).prefixed("comm_split: "));
    uint64_t split_no = ++c->children;
    if (color == COMM_UNSET) return Status::Ok();
    std::vector<std::pair<int32_t, int>> members;  // (key, parent rank) of my color
    for (int r = 0; r < c->size; ++r)
      if (all[2 * static_cast<size_t>(r)] == color) members.emplace_back(all[2 * static_cast<size_t>(r) + 1], r);
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    std::vector<int> parent_ranks;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].second == c->rank) new_rank = static_cast<int>(i);
      parent_ranks.push_back(members[i].second);
    }
    std::string id = c->id + ".s" + std::to_string(split_no) + "c" + std::to_string(color);
    return comm::create_child(c, id, new_rank, parent_ranks, out).prefixed("comm_split: ");
  });
}

COMM_API comm_status_t comm_shrink(comm_t c, const int* exclude_ranks, int n_exclude, comm_t* out) {
  return comm::guarded("comm_shrink", [&]() -> Status {
    if (c == nullptr || out == nullptr) return comm::InvalidArgument("comm_shrink: NULL communicator or output pointer");
    *out = nullptr;
    if (n_exclude == COMM_SHRINK_AGREE && exclude_ranks == nullptr) {
      std::vector<int> failed;
      COMM_RETURN_IF_ERROR(comm::agree_failed(c, &failed));
      return comm::shrink_communicator(c, failed, out);
    }
    if (n_exclude < 0 || n_exclude >= c->size)
      return comm::InvalidArgument("comm_shrink: n_exclude " + std::to_string(n_exclude) + " must be in 0.." +
                                   std::to_string(c->size - 1) + " (at least this rank survives), or COMM_SHRINK_AGREE "
                                   "with exclude_ranks NULL (the library finds the failed ranks)");
    if (n_exclude > 0 && exclude_ranks == nullptr)
      return comm::InvalidArgument("comm_shrink: exclude_ranks is NULL but n_exclude is " + std::to_string(n_exclude));
    std::vector<int> excluded(exclude_ranks, exclude_ranks + n_exclude);
    return comm::shrink_communicator(c, excluded, out);
  });
}

namespace {
// comm_agree_failed and comm_agree (flag non-NULL): the arguments checked, the set copied out.
comm_status_t agree_call(const char* call, comm_t c, int* flag, int* failed, int capacity, int* n_failed) {
  return comm::guarded(call, [&]() -> Status {
    const std::string name = call;
    if (c == nullptr || n_failed == nullptr)
      return comm::InvalidArgument(name + ": NULL communicator or n_failed pointer");
    if (capacity < 0 || (capacity > 0 && failed == nullptr))
      return comm::InvalidArgument(name + ": capacity " + std::to_string(capacity) +
                                   " needs a failed array of that many ints (NULL only with 0)");
    std::vector<int> agreed;
    COMM_RETURN_IF_ERROR(comm::agree_failed(c, &agreed, flag));
    *n_failed = static_cast<int>(agreed.size());
    for (int i = 0; i < capacity && i < *n_failed; ++i) failed[i] = agreed[static_cast<size_t>(i)];
    return Status::Ok();
  });
}
}  // namespace

COMM_API comm_status_t comm_agree_failed(comm_t c, int* failed, int capacity, int* n_failed) {
  return agree_call("comm_agree_failed", c, nullptr, failed, capacity, n_failed);
}

COMM_API comm_status_t comm_agree(comm_t c, int* flag, int* failed, int capacity, int* n_failed) {
  if (flag == nullptr)
    return comm::guarded("comm_agree", [] { return comm::InvalidArgument("comm_agree: NULL flag pointer"); });
  return agree_call("comm_agree", c, flag, failed, capacity, n_failed);
}

COMM_API comm_status_t comm_exclude(comm_t c, const int* ranks, int n) {
  return comm::guarded("comm_exclude", [&]() -> Status {
    if (c == nullptr) return comm::InvalidArgument("comm_exclude: NULL communicator");
    if (n < 1 || n > c->size - 1 || ranks == nullptr)
      return comm::InvalidArgument("comm_exclude: " + std::to_string(n) + " ranks (" + (ranks ? "" : "NULL, ") +
                                   "must be 1.." + std::to_string(c->size - 1) + ", never this rank)");
    std::vector<bool> named(static_cast<size_t>(c->size), false);
    for (int i = 0; i < n; ++i) {
      const int r = ranks[i];
      if (r < 0 || r >= c->size || r == c->rank || named[static_cast<size_t>(r)])
        return comm::InvalidArgument("comm_exclude: rank " + std::to_string(r) + " (element " + std::to_string(i) +
                                     ") is " + (r < 0 || r >= c->size ? "out of range 0.." + std::to_string(c->size - 1)
                                                : r == c->rank ? "this rank" : "named twice") +
                                     "; nothing recorded");
      named[static_cast<size_t>(r)] = true;
    }
    if (!c->job_store) return comm::Unavailable("comm_exclude: this communicator has no job store");
    Status st = comm::grow::record_exclusions(c, std::vector<int>(ranks, ranks + n));
    return st.ok() ? st : st.prefixed("comm_exclude, rank " + std::to_string(c->rank) + ": ");
  });
}

COMM_API comm_status_t comm_grow(comm_t c, int n_join, comm_t* out) {
  return comm::guarded("comm_grow", [&]() -> Status {
    if (c == nullptr || out == nullptr) return comm::InvalidArgument("comm_grow: NULL communicator or output pointer");
    *out = nullptr;
    if (n_join <= 0 && n_join != COMM_GROW_WAITING)
      return comm::InvalidArgument("comm_grow: n_join " + std::to_string(n_join) + " must be positive (that many "
                                   "joiners), or COMM_GROW_WAITING (the joiners waiting now)");
    return comm::grow::grow_communicator(c, n_join, out);
  });
}

COMM_API comm_status_t comm_abort(comm_t c) {
  return comm::guarded("comm_abort", [&]() -> Status {
    if (c == nullptr) return comm::InvalidArgument("comm_abort: NULL communicator");
    if (!c->aborted.exchange(true)) {
      COMM_WARN(kInit, "comm %s rank %d: aborted by comm_abort", c->id.c_str(), c->rank);
      if (c->transport) c->transport->abort();
      std::string written;
      Status dumped = comm::dump_flight_recorder(c, "", &written);  // COMM_FLIGHT_RECORDER_FILE, when set
      if (!dumped.ok()) COMM_WARN(kInit, "%s", dumped.message().c_str());
    }
    return Status::Ok();
  });
}

COMM_API comm_status_t comm_dump_flight_recorder(comm_t c, const char* path) {
  return comm::guarded("comm_dump_flight_recorder", [&]() -> Status {
    if (c == nullptr) return comm::InvalidArgument("comm_dump_flight_recorder: NULL communicator");
    std::string written;
    COMM_RETURN_IF_ERROR(comm::dump_flight_recorder(c, path != nullptr ? path : "", &written));
    if (written.empty())
      return comm::InvalidArgument("comm_dump_flight_recorder: no path: pass one, or set COMM_FLIGHT_RECORDER_FILE");
    return Status::Ok();
  });
}

COMM_API comm_status_t comm_destroy(comm_t c) {
  return comm::guarded("comm_destroy", [&]() -> Status {
    if (c == nullptr) return comm::InvalidArgument("comm_destroy: NULL communicator");
    comm::destroy_communicator(c);
    return Status::Ok();
  });
}

COMM_API comm_status_t comm_get_async_error(comm_t c) {
  if (c == nullptr) return COMM_ERR_INVALID_ARGUMENT;
  std::lock_guard<std::mutex> lock(c->state_mu);
  if (!c->async_error.ok()) return c->async_error.code();
  if (c->aborted.load()) return COMM_ERR_ABORTED;
  return COMM_OK;
}

COMM_API comm_status_t comm_wait(comm_request_t req) {
  return comm::guarded("comm_wait", [&]() -> Status {
    if (req == nullptr) return comm::InvalidArgument("comm_wait: NULL request");
    return comm::wait_request(req);
  });
}

COMM_API comm_status_t comm_test(comm_request_t req, int* done) {
  return comm::guarded("comm_test", [&]() -> Status {
    if (req == nullptr || done == nullptr) return comm::InvalidArgument("comm_test: NULL request or output pointer");
    bool finished = false;
    Status st = comm::test_request(req, &finished);
    *done = finished ? 1 : 0;
    return st;
  });
}

COMM_API comm_status_t comm_group_start(void) {
  return comm::guarded("comm_group_start", [&]() -> Status {
    comm::group_start();
    return Status::Ok();
  });
}

COMM_API comm_status_t comm_group_end(void) {
  return comm::guarded("comm_group_end", [&]() -> Status { return comm::group_end(); });
}

// Shared memory that local peers already map (this rank's arena) when the communicator has
// one, so collectives read these buffers in place; plain, touched, 64-byte-aligned memory
// otherwise (or when the arena is full), which every transport reads with one copy more.
COMM_API comm_status_t comm_mem_alloc(comm_t c, size_t bytes, void** ptr) {
  return comm::guarded("comm_mem_alloc", [&]() -> Status {
    if (c == nullptr || ptr == nullptr) return comm::InvalidArgument("comm_mem_alloc: NULL communicator or output pointer");
    *ptr = nullptr;
    if (bytes == 0) return Status::Ok();
    Status device_st;  // an NCCL communicator (COMM_TRANSPORT=nccl): NCCL-registered device memory
    if (comm::device::mem_alloc(c, bytes, ptr, &device_st)) return device_st;
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded < bytes) return comm::InvalidArgument("comm_mem_alloc: " + std::to_string(bytes) + " bytes overflows");
    if (c->job_memory) {
      void* p = nullptr;
      Status st = c->job_memory->allocate(bytes, &p);
      if (st.ok()) {
        *ptr = p;
        return st;
      }
      COMM_WARN(kInit, "comm_mem_alloc: %s; returning ordinary memory (collectives on it take one copy more)",
                st.message().c_str());
    }
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) return comm::SystemError("comm_mem_alloc: cannot allocate " + std::to_string(bytes) + " bytes");
    std::memset(p, 0, rounded);  // first touch now, not on the first collective
    *ptr = p;
    return Status::Ok();
  });
}

COMM_API comm_status_t comm_mem_free(comm_t c, void* ptr) {
  return comm::guarded("comm_mem_free", [&]() -> Status {
    if (c == nullptr) return comm::InvalidArgument("comm_mem_free: NULL communicator");
    if (ptr == nullptr) return Status::Ok();
    Status device_st;
    if (comm::device::mem_free(c, ptr, &device_st)) return device_st;
    if (c->job_memory && c->job_memory->release(ptr)) return Status::Ok();
    std::free(ptr);
    return Status::Ok();
  });
}

}  // extern "C"

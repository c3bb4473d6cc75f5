// The NCCL communicator behind a libcomm communicator: created with a unique id exchanged
// through libcomm's store, nonblocking (ncclConfig_t.blocking = 0) so that every wait on it is
// bounded by the communicator's timeout and ended by comm_abort; collectives enqueued on the
// caller's stream.
#include "dtype.h"
#include "log.h"
#include "process_plan.h"
#include "device/state.h"
#include "tuning/nccl_settings.h"

namespace comm::device {
namespace {

ncclDataType_t nccl_dtype(comm_dtype_t t) {
  switch (t) {
    case COMM_FLOAT32: return ncclFloat32;
    case COMM_FLOAT64: return ncclFloat64;
    case COMM_FLOAT16: return ncclFloat16;
    case COMM_BFLOAT16: return ncclBfloat16;
    case COMM_INT8: return ncclInt8;
    case COMM_UINT8: return ncclUint8;
    case COMM_INT32: return ncclInt32;
    case COMM_UINT32: return ncclUint32;
    case COMM_INT64: return ncclInt64;
    case COMM_UINT64: return ncclUint64;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(comm_op_t op) {
  switch (op) {
    case COMM_SUM: return ncclSum;
    case COMM_PROD: return ncclProd;
    case COMM_MIN: return ncclMin;
    case COMM_MAX: return ncclMax;
    case COMM_AVG: return ncclAvg;
  }
  return ncclSum;
}

std::string to_hex(const void* data, size_t n) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char b = static_cast<const unsigned char*>(data)[i];
    out.push_back(hex[b >> 4]);
    out.push_back(hex[b & 15]);
  }
  return out;
}

bool from_hex(const std::string& text, void* data, size_t n) {
  if (text.size() != 2 * n) return false;
  auto nibble = [](char ch) { return ch >= 'a' ? ch - 'a' + 10 : ch - '0'; };
  for (size_t i = 0; i < n; ++i)
    static_cast<unsigned char*>(data)[i] = static_cast<unsigned char>(nibble(text[2 * i]) << 4 | nibble(text[2 * i + 1]));
  return true;
}

}  // namespace

Status State::settle(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::Ok();
  const Deadline deadline = Deadline::after_ms(comm->settings.timeout_ms);
  for (int spins = 0; r == ncclInProgress; ++spins) {
    if (comm->aborted.load(std::memory_order_acquire))
      return Aborted(where() + what + ": the communicator was aborted (comm_abort)");
    if (deadline.expired())
      return Timeout(where() + what + " did not complete within " + std::to_string(comm->settings.timeout_ms) +
                     " ms (COMM_TIMEOUT_MS): a rank that never made the same call, or one that hangs");
    if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(100));
    ncclResult_t state = ncclSuccess;
    ncclResult_t q = nccl_comm ? nccl->ncclCommGetAsyncError(nccl_comm, &state) : ncclInvalidUsage;
    r = q != ncclSuccess ? q : state;
  }
  if (r == ncclSuccess) return Status::Ok();
  const std::string text = where() + what + " failed: " + nccl->error_text(r);
  switch (r) {
    case ncclInvalidArgument: return InvalidArgument(text + "; check the buffers, count and stream");
    case ncclInvalidUsage: return InvalidUsage(text + "; every rank must make the same calls in the same order");
    case ncclRemoteError:
    case ncclSystemError:
      return RemoteError(text + "; a peer failed or the network broke (NCCL_DEBUG=WARN shows NCCL's view). "
                                "Destroy this communicator and make a new one");
    case ncclUnhandledCudaError: return SystemError(text + "; a CUDA error on this rank (check the device and stream)");
    default: return Internal(text);
  }
}

Status State::create_nccl(int device) {
  // NCCL reads its environment once, at its first initialisation: the plan's NCCL_* settings and
  // the tuning profile's go in before that (never over the user's; prepare_process runs at
  // comm_init, this makes sure even when the probe saw no GPU).
  std::vector<std::string> notes;
  const auto tuned = tuning::nccl_settings(comm->settings.profile.get(), comm->size, &notes);
  if (!topology::apply_nccl_settings_once(tuned) && !tuned.empty())
    COMM_INFO(kEnv, "%sthe tuning profile's NCCL settings for %d ranks (%s) not applied: this process set NCCL's "
              "environment for its first NCCL communicator already, and NCCL reads it once",
              where().c_str(), comm->size, tuned.front().reason.c_str());
  if (device < 0) device = 0;
  cuda_device = device;
  cudaError_t e = cuda->cudaSetDevice(device);
  if (e != cudaSuccess)
    return SystemError(where() + "cudaSetDevice(" + std::to_string(device) + ") failed: " + cuda->error_text(e));
  auto store = make_prefix_store(comm->job_store, "comm/" + comm->id + "/device");
  ncclUniqueId id{};
  if (comm->rank == 0) {
    ncclResult_t r = nccl->ncclGetUniqueId(&id);
    std::string value(r == ncclSuccess ? "I" : "E");
    value.append(r == ncclSuccess ? to_hex(&id, sizeof id) : nccl->error_text(r));
    COMM_RETURN_IF_ERROR(store->set("nccl_id", value));
    if (r != ncclSuccess) return SystemError(where() + "ncclGetUniqueId failed: " + nccl->error_text(r));
  } else {
    std::string value;
    Status st = store->get("nccl_id", &value, Deadline::after_ms(comm->settings.timeout_ms));
    if (!st.ok())
      return Timeout(where() + "rank 0 did not publish the NCCL unique id within " +
                     std::to_string(comm->settings.timeout_ms) + " ms");
    if (value.empty() || value[0] == 'E') return RemoteError(where() + "rank 0 could not create the NCCL unique id: " + value.substr(1));
    if (!from_hex(value.substr(1), &id, sizeof id)) return Internal(where() + "malformed NCCL unique id in the store");
  }
  nccl_name = "libcomm comm " + comm->id;  // lives as long as the NCCL communicator
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and every call return at once; settle() bounds the wait
  config.commName = nccl_name.c_str();
  ncclResult_t r = nccl->ncclCommInitRankConfig(&nccl_comm, comm->size, id, comm->rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) nccl_comm = nullptr;
  Status st = settle(r, "ncclCommInitRankConfig");
  if (!st.ok()) {
    if (nccl_comm) (void)nccl->ncclCommAbort(nccl_comm);
    nccl_comm = nullptr;
    return st;
  }
  e = cuda->cudaEventCreateWithFlags(&probe_event, cudaEventDisableTiming);
  if (e != cudaSuccess) return SystemError(where() + "cudaEventCreate failed: " + cuda->error_text(e));
  char busid[64] = "?";
  (void)cuda->cudaDeviceGetPCIBusId(busid, sizeof busid, device);
  std::string ft;
  for (const auto& [call, has] : nccl->fault_tolerance()) ft += (ft.empty() ? "" : ", ") + call + (has ? " yes" : " no");
  COMM_INFO(kInit, "comm %s rank %d: NCCL %s communicator on GPU %d (%s) ready; fault-tolerance calls: %s",
            comm->id.c_str(), comm->rank, nccl->version_text().c_str(), device, busid, ft.c_str());
  why = "NCCL " + nccl->version_text();
  start_watchdog();
  return Status::Ok();
}

Status State::run_nccl(const algo::CollArgs& a, cudaStream_t s, bool grouped) {
  std::unique_lock<std::mutex> lock(watch_mu);  // the watchdog aborts and frees the NCCL communicator under it
  if (nccl_comm == nullptr || nccl_dead.load(std::memory_order_acquire)) {
    lock.unlock();
    Status st = check_usable(comm);
    return st.ok() ? RemoteError(where() + "the NCCL communicator was aborted after an error; destroy this communicator")
                   : st;
  }
  const ncclDataType_t dt = nccl_dtype(a.dtype);
  const size_t esz = dtype_size(a.dtype);
  ncclResult_t r = ncclSuccess;
  const char* what = "";
  switch (a.kind) {
    case transport::CollKind::kAllreduce:
      what = "ncclAllReduce";
      r = nccl->ncclAllReduce(a.sendbuf, a.recvbuf, a.count, dt, nccl_op(a.op), nccl_comm, s);
      break;
    case transport::CollKind::kBroadcast:
      what = "ncclBroadcast";
      r = nccl->ncclBroadcast(a.sendbuf, a.recvbuf, a.count, dt, a.root, nccl_comm, s);
      break;
    case transport::CollKind::kReduce:
      what = "ncclReduce";
      r = nccl->ncclReduce(a.sendbuf, a.recvbuf, a.count, dt, nccl_op(a.op), a.root, nccl_comm, s);
      break;
    case transport::CollKind::kAllgather:
      what = "ncclAllGather";
      r = nccl->ncclAllGather(a.sendbuf, a.recvbuf, a.count, dt, nccl_comm, s);
      break;
    case transport::CollKind::kReduceScatter:
      what = "ncclReduceScatter";
      r = nccl->ncclReduceScatter(a.sendbuf, a.recvbuf, a.count, dt, nccl_op(a.op), nccl_comm, s);
      break;
    case transport::CollKind::kAlltoall: {
      what = "all-to-all (ncclSend/ncclRecv group)";
      r = nccl->ncclGroupStart();
      const size_t bytes = a.count * esz;
      for (int p = 0; p < comm->size && r == ncclSuccess; ++p) {
        r = nccl->ncclSend(static_cast<const char*>(a.sendbuf) + static_cast<size_t>(p) * bytes, a.count, dt, p, nccl_comm, s);
        if (r == ncclSuccess)
          r = nccl->ncclRecv(static_cast<char*>(a.recvbuf) + static_cast<size_t>(p) * bytes, a.count, dt, p, nccl_comm, s);
      }
      ncclResult_t end = nccl->ncclGroupEnd();
      if (r == ncclSuccess) r = end;
      break;
    }
    case transport::CollKind::kSendRecv:
      what = a.sendbuf != nullptr ? "ncclSend" : "ncclRecv";
      r = a.sendbuf != nullptr ? nccl->ncclSend(a.sendbuf, a.count, dt, a.peer, nccl_comm, s)
                               : nccl->ncclRecv(a.recvbuf, a.count, dt, a.peer, nccl_comm, s);
      break;
    default: return Internal(where() + "no NCCL call for this collective");
  }
  if (r != ncclSuccess && !(grouped && r == ncclInProgress)) {
    Status st = settle(r, what);
    if (!st.ok()) {
      lock.unlock();
      return fail(st);
    }
  }
  if (!grouped) track(s);
  return Status::Ok();
}

void State::destroy_nccl() {
  if (nccl_comm == nullptr) return;
  bool broken;
  {
    std::lock_guard<std::mutex> lock(comm->state_mu);
    broken = !comm->broken.ok();
  }
  {
    std::lock_guard<std::mutex> lock(mem_mu);
    for (auto& [ptr, handle] : registered) {
      if (handle) (void)nccl->ncclCommDeregister(nccl_comm, handle);
      if (nccl->ncclMemFree) (void)nccl->ncclMemFree(ptr);
      else (void)cuda->cudaFree(ptr);
    }
    registered.clear();
  }
  // Graceful: finalize flushes what is in flight (bounded); after an error or comm_abort, or
  // when finalize cannot finish in time, abort.
  if (!broken && !comm->aborted.load() && settle(nccl->ncclCommFinalize(nccl_comm), "ncclCommFinalize").ok())
    (void)nccl->ncclCommDestroy(nccl_comm);
  else
    (void)nccl->ncclCommAbort(nccl_comm);
  nccl_comm = nullptr;
}

}  // namespace comm::device

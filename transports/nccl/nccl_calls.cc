#include "nccl/nccl_calls.h"

#include <chrono>
#include <thread>

#include "deadline.h"
#include "types.h"

namespace comm::nccl {
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

Status settle(const NcclLibrary& nccl, ncclComm_t comm, ncclResult_t r, const char* what, const WaitPolicy& w) {
  if (r == ncclSuccess) return Status::Ok();
  const Deadline deadline = Deadline::after_ms(w.timeout_ms);
  for (int spins = 0; r == ncclInProgress; ++spins) {
    if (w.aborted != nullptr && w.aborted->load(std::memory_order_acquire))
      return Aborted(w.where + what + ": the communicator was aborted (comm_abort)");
    if (deadline.expired())
      return Timeout(w.where + what + " did not complete within " + std::to_string(w.timeout_ms) +
                     " ms (COMM_TIMEOUT_MS): a rank that never made the same call, or one that hangs");
    if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(100));
    ncclResult_t state = ncclSuccess;
    ncclResult_t q = comm ? nccl.ncclCommGetAsyncError(comm, &state) : ncclInvalidUsage;
    r = q != ncclSuccess ? q : state;
  }
  if (r == ncclSuccess) return Status::Ok();
  const std::string text = w.where + what + " failed: " + nccl.error_text(r);
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

Status exchange_unique_id(const NcclLibrary& nccl, Store& store, int rank, const WaitPolicy& w, ncclUniqueId* id) {
  if (rank == 0) {
    ncclResult_t r = nccl.ncclGetUniqueId(id);
    std::string value(r == ncclSuccess ? "I" : "E");
    value.append(r == ncclSuccess ? to_hex(id, sizeof *id) : nccl.error_text(r));
    COMM_RETURN_IF_ERROR(store.set("nccl_id", value));
    if (r != ncclSuccess) return SystemError(w.where + "ncclGetUniqueId failed: " + nccl.error_text(r));
    return Status::Ok();
  }
  std::string value;
  Status st = store.get("nccl_id", &value, Deadline::after_ms(w.timeout_ms));
  if (!st.ok())
    return Timeout(w.where + "rank 0 did not publish the NCCL unique id within " + std::to_string(w.timeout_ms) +
                   " ms");
  if (value.empty() || value[0] == 'E')
    return RemoteError(w.where + "rank 0 could not create the NCCL unique id: " + value.substr(value.empty() ? 0 : 1));
  if (!from_hex(value.substr(1), id, sizeof *id)) return Internal(w.where + "malformed NCCL unique id in the store");
  return Status::Ok();
}

Status init_comm(const NcclLibrary& nccl, int nranks, int rank, const ncclUniqueId& id, const char* name,
                 const WaitPolicy& w, ncclComm_t* out) {
  ncclComm_t comm = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and every call return at once; settle() bounds the wait
  config.commName = name;
  ncclResult_t r = nccl.ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) comm = nullptr;
  Status st = settle(nccl, comm, r, "ncclCommInitRankConfig", w);
  if (!st.ok()) {
    if (comm) (void)nccl.ncclCommAbort(comm);
    return st;
  }
  *out = comm;
  return Status::Ok();
}

Status shrink_comm(const NcclLibrary& nccl, ncclComm_t comm, std::vector<int> excluded, bool abort_parent,
                   const char* name, const WaitPolicy& w, ncclComm_t* out) {
  if (nccl.ncclCommShrink == nullptr)
    return Unavailable(w.where + "the loaded NCCL " + nccl.version_text() + " has no ncclCommShrink (NCCL 2.27 or "
                       "later has it); install a newer NCCL (COMM_NCCL_LIBRARY), or make a new communicator with "
                       "comm_init");
  ncclComm_t made = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = name;
  ncclResult_t r = nccl.ncclCommShrink(comm, excluded.data(), static_cast<int>(excluded.size()), &made, &config,
                                       abort_parent ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT);
  if (r != ncclSuccess && r != ncclInProgress) made = nullptr;
  Status st = settle(nccl, made, r, "ncclCommShrink", w);
  if (!st.ok()) {
    if (made) (void)nccl.ncclCommAbort(made);
    return st;
  }
  *out = made;
  return Status::Ok();
}

ncclResult_t enqueue(const NcclLibrary& nccl, ncclComm_t comm, const Call& a, cudaStream_t s, const char** what) {
  const ncclDataType_t dt = nccl_dtype(a.dtype);
  switch (a.kind) {
    case transport::CollKind::kAllreduce:
      *what = "ncclAllReduce";
      return nccl.ncclAllReduce(a.sendbuf, a.recvbuf, a.count, dt, nccl_op(a.op), comm, s);
    case transport::CollKind::kBroadcast:
      *what = "ncclBroadcast";
      return nccl.ncclBroadcast(a.sendbuf, a.recvbuf, a.count, dt, a.root, comm, s);
    case transport::CollKind::kReduce:
      *what = "ncclReduce";
      return nccl.ncclReduce(a.sendbuf, a.recvbuf, a.count, dt, nccl_op(a.op), a.root, comm, s);
    case transport::CollKind::kAllgather:
      *what = "ncclAllGather";
      return nccl.ncclAllGather(a.sendbuf, a.recvbuf, a.count, dt, comm, s);
    case transport::CollKind::kReduceScatter:
      *what = "ncclReduceScatter";
      return nccl.ncclReduceScatter(a.sendbuf, a.recvbuf, a.count, dt, nccl_op(a.op), comm, s);
    case transport::CollKind::kAlltoall: {
      *what = "all-to-all (ncclSend/ncclRecv group)";
      ncclResult_t r = nccl.ncclGroupStart();
      const size_t bytes = a.count * dtype_size(a.dtype);
      for (int p = 0; p < a.nranks && r == ncclSuccess; ++p) {
        r = nccl.ncclSend(static_cast<const char*>(a.sendbuf) + static_cast<size_t>(p) * bytes, a.count, dt, p, comm, s);
        if (r == ncclSuccess)
          r = nccl.ncclRecv(static_cast<char*>(a.recvbuf) + static_cast<size_t>(p) * bytes, a.count, dt, p, comm, s);
      }
      ncclResult_t end = nccl.ncclGroupEnd();
      return r == ncclSuccess ? end : r;
    }
    case transport::CollKind::kSendRecv:
      *what = a.sendbuf != nullptr ? "ncclSend" : "ncclRecv";
      return a.sendbuf != nullptr ? nccl.ncclSend(a.sendbuf, a.count, dt, a.peer, comm, s)
                                  : nccl.ncclRecv(a.recvbuf, a.count, dt, a.peer, comm, s);
    default:
      *what = nullptr;  // no NCCL call for this collective: the caller's bug
      return ncclInvalidUsage;
  }
}

void close_comm(const NcclLibrary& nccl, ncclComm_t comm, bool graceful, const WaitPolicy& w) {
  if (comm == nullptr) return;
  if (graceful && settle(nccl, comm, nccl.ncclCommFinalize(comm), "ncclCommFinalize", w).ok())
    (void)nccl.ncclCommDestroy(comm);
  else
    (void)nccl.ncclCommAbort(comm);
}

}  // namespace comm::nccl

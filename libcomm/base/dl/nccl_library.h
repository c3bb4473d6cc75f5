// NCCL, opened with dlopen by its versioned name (libnccl.so.2). The table's types come from
// nccl.h, so a signature can never drift; calls newer than the oldest NCCL libcomm supports
// (2.19: ncclMemAlloc, ncclCommRegister) are optional and may stay null.
#pragma once

#include <nccl.h>

#include <string>
#include <utility>
#include <vector>

namespace comm::dl {

struct NcclLibrary {
  std::string path;     // the name dlopen succeeded with
  std::string why_not;  // why it cannot be used ("" when it can)
  int version = 0;      // ncclGetVersion: 22809 for 2.28.9

#define COMM_NCCL_FN(name) decltype(&::name) name = nullptr
  // required
  COMM_NCCL_FN(ncclGetVersion);
  COMM_NCCL_FN(ncclGetErrorString);
  COMM_NCCL_FN(ncclGetUniqueId);
  COMM_NCCL_FN(ncclCommInitRankConfig);
  COMM_NCCL_FN(ncclCommGetAsyncError);
  COMM_NCCL_FN(ncclCommAbort);
  COMM_NCCL_FN(ncclCommDestroy);
  COMM_NCCL_FN(ncclCommFinalize);
  COMM_NCCL_FN(ncclAllReduce);
  COMM_NCCL_FN(ncclBroadcast);
  COMM_NCCL_FN(ncclReduce);
  COMM_NCCL_FN(ncclAllGather);
  COMM_NCCL_FN(ncclReduceScatter);
  COMM_NCCL_FN(ncclSend);
  COMM_NCCL_FN(ncclRecv);
  COMM_NCCL_FN(ncclGroupStart);
  COMM_NCCL_FN(ncclGroupEnd);
  // optional
  COMM_NCCL_FN(ncclGetLastError);
  COMM_NCCL_FN(ncclMemAlloc);
  COMM_NCCL_FN(ncclMemFree);
  COMM_NCCL_FN(ncclCommRegister);
  COMM_NCCL_FN(ncclCommDeregister);
  COMM_NCCL_FN(ncclCommShrink);
  COMM_NCCL_FN(ncclCommRevoke);
  COMM_NCCL_FN(ncclCommSplit);
#undef COMM_NCCL_FN

  bool usable() const { return why_not.empty(); }
  std::string version_text() const;  // "2.28.9"
  // The fault-tolerance calls and whether this NCCL has them, for the log and comm-topo:
  // ncclCommAbort, ncclCommGetAsyncError, ncclCommFinalize, ncclCommSplit, ncclCommShrink (2.27),
  // ncclCommRevoke (2.28).
  std::vector<std::pair<std::string, bool>> fault_tolerance() const;
  // "ncclRemoteError (remote process exited or there was a network error): <last error>"
  std::string error_text(ncclResult_t r, ncclComm_t comm = nullptr) const;
};

// Opens NCCL once per name for the life of the process. `override_path` (COMM_NCCL_LIBRARY)
// replaces the default name libnccl.so.2.
const NcclLibrary& nccl_library(const std::string& override_path);

}  // namespace comm::dl

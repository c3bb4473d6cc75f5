// Device buffers: what the communicator calls when a collective comes with a stream. Either
// NCCL (loaded with dlopen) runs it on that stream, or, without NCCL or when COMM_TRANSPORT
// forbids it, it is staged through pinned host memory onto the host transports. This header
// needs no CUDA header, so the core compiles the same with and without them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "algorithms/algorithm.h"
#include "comm/comm.h"
#include "status.h"

namespace comm::device {

// What this process can load, for the log, comm-topo and the availability decision.
struct Probe {
  bool built_with_headers = false;  // compiled against cuda_runtime_api.h and nccl.h
  std::string cuda_library;         // "libcudart.so.13", "" when not found
  int cuda_runtime_version = 0, cuda_driver_version = 0;
  int cuda_devices = 0;
  std::string nccl_library;         // "libnccl.so.2", "" when not found
  std::string nccl_version;         // "2.28.9", "" when not loaded
  std::vector<std::pair<std::string, bool>> fault_tolerance;  // call -> present in the loaded NCCL
  bool usable = false;              // NCCL can run collectives here
  std::string why_not;              // library not found / no CUDA device / driver too old
};
// Cached per (COMM_NCCL_LIBRARY, COMM_CUDA_LIBRARY); never fails.
Probe probe_process();

class State;  // per communicator: the NCCL communicator or the staging buffers

// COMM_TRANSPORT=nccl at comm_init: decides with every rank and creates the NCCL communicator
// now, so that a job that asked for NCCL and cannot have it fails at init, on every rank,
// saying why (COMM_ERR_UNAVAILABLE).
Status init_forced(comm_t c);
// A collective with a non-NULL stream, validated already. grouped: inside comm_group_start/end.
Status issue(comm_t c, const algo::CollArgs& args, comm_stream_t stream, bool grouped);
// The outermost comm_group_end on this thread: closes the NCCL group device calls opened.
Status group_end();
// After the group's host calls ran (ok: they all succeeded): staged receives copy their data
// back to the device.
Status group_finish(bool ok);
// comm_mem_alloc/free on a communicator whose device path is NCCL (COMM_TRANSPORT=nccl):
// NCCL-registered device memory. Returns false when the call is not the device path's.
bool mem_alloc(comm_t c, size_t bytes, void** ptr, Status* st);
bool mem_free(comm_t c, void* ptr, Status* st);
// comm_destroy: stops the watchdog, finalizes (or aborts, after an error) the NCCL communicator.
void release(comm_t c);

}  // namespace comm::device

// Device buffers: what the communicator calls when a collective comes with a stream. Either
// NCCL (loaded with dlopen) runs it on that stream, or, without NCCL or when COMM_TRANSPORT
// forbids it, it is staged through pinned host memory onto the host transports. This header
// needs no CUDA header, so the core compiles the same with and without them.
#pragma once

#include <memory>
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
// The gradient engine's device gradients (engine_streams.cc): the engine's own stream, events
// that order it after the stream the gradients are produced on (and that stream after it at the
// end of a step), and device memory for the buckets. The buckets' all-reduces are ordinary
// collectives with this stream, so they take the communicator's device path: NCCL, or staged
// through pinned host memory. Calls from several threads are fine (the CUDA runtime's are).
class EngineStreams {
 public:
  virtual ~EngineStreams() = default;
  virtual bool staged() const = 0;               // the communicator stages device buffers
  virtual const std::string& why() const = 0;    // the device path and why it was chosen
  virtual comm_stream_t stream() const = 0;      // the engine's communication stream
  virtual void bind_thread() const = 0;          // the engine's device current on this thread
  virtual Status reserve(size_t buckets) = 0;    // one ready-event per bucket
  virtual Status alloc(size_t bytes, void** ptr) = 0;  // device memory, zeroed (at finalize, never in a step)
  virtual void release(void* ptr) = 0;
  // Bucket b's gradients are all reported: an event on the producer stream now...
  virtual Status ready(size_t bucket) = 0;
  // ...that the engine's stream waits for before the bucket's copies and all-reduce.
  virtual Status wait_ready(size_t bucket) = 0;
  virtual Status copy(void* dst, const void* src, size_t bytes) = 0;  // device to device, on the engine's stream
  virtual Status zero(void* ptr, size_t bytes) = 0;                   // on the engine's stream
  // End of a step: the producer stream waits for everything enqueued on the engine's stream.
  virtual Status join() = 0;
  // The host waits for the engine's stream (bounded by the timeout, ended by comm_abort).
  virtual Status synchronize(const char* what) = 0;
};
// comm_engine_create with a stream, on the engine's own communicator (collective: decides the
// device path with every rank if no device call did yet). COMM_ERR_UNAVAILABLE when some rank
// has no CUDA runtime or device, or the build has no CUDA headers.
Status open_engine_streams(comm_t c, comm_stream_t producer, std::unique_ptr<EngineStreams>* out);
// comm_shrink, before anything moves: a communicator whose device buffers go through NCCL can
// be shrunk only with ncclCommShrink (COMM_ERR_UNAVAILABLE naming the NCCL when it lacks it).
Status check_shrink(comm_t c);
// comm_shrink, once the host part made `child`: the parent's NCCL communicator shrunk alike
// (ncclCommShrink); nothing to do when the parent has none (the child decides at its first
// device call, as any communicator does).
Status shrink(comm_t parent, comm_t child, const std::vector<int>& excluded);
// comm_destroy: stops the watchdog, finalizes (or aborts, after an error) the NCCL communicator.
void release(comm_t c);

}  // namespace comm::device

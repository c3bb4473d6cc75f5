// The gradient engine's device side: its own stream, one event per bucket recorded on the stream
// the gradients are produced on (the engine's stream waits for it), and one event at the end of a
// step that the producer stream waits for. The host never waits inside a step on the NCCL path;
// the staged path's own wait for its copy in is on the engine's thread.
#include <vector>

#include "log.h"
#include "device/state.h"

namespace comm::device {

Status decide(comm_t c, int device, std::shared_ptr<State>* out);  // decide.cc

namespace {

class CudaEngineStreams final : public EngineStreams {
 public:
  CudaEngineStreams(State* state, cudaStream_t producer) : state_(state), cuda_(*state->cuda), producer_(producer) {}

  ~CudaEngineStreams() override {
    for (cudaEvent_t ev : ready_) (void)cuda_.cudaEventDestroy(ev);
    if (done_) (void)cuda_.cudaEventDestroy(done_);
    if (stream_) (void)cuda_.cudaStreamDestroy(stream_);
  }

  Status open() {
    why_ = state_->why;
    if (cudaError_t e = cuda_.cudaGetDevice(&device_); e != cudaSuccess) return cuda_fail("cudaGetDevice", e);
    // Non-blocking: the engine's stream never waits on the legacy default stream by accident.
    if (cudaError_t e = cuda_.cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess)
      return cuda_fail("cudaStreamCreateWithFlags", e);
    if (cudaError_t e = cuda_.cudaEventCreateWithFlags(&done_, cudaEventDisableTiming); e != cudaSuccess)
      return cuda_fail("cudaEventCreateWithFlags", e);
    return Status::Ok();
  }

  bool staged() const override { return state_->path == State::Path::kStaged; }
  const std::string& why() const override { return why_; }
  comm_stream_t stream() const override { return stream_; }
  void bind_thread() const override { (void)cuda_.cudaSetDevice(device_); }

  Status reserve(size_t buckets) override {
    while (ready_.size() < buckets) {
      cudaEvent_t ev = nullptr;
      if (cudaError_t e = cuda_.cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess)
        return cuda_fail("cudaEventCreateWithFlags", e);
      ready_.push_back(ev);
    }
    return Status::Ok();
  }

  Status alloc(size_t bytes, void** ptr) override {
    *ptr = nullptr;
    if (cudaError_t e = cuda_.cudaMalloc(ptr, bytes); e != cudaSuccess) {
      *ptr = nullptr;
      return cuda_fail("cudaMalloc(" + std::to_string(bytes) + ") for the engine's buckets", e);
    }
    if (cudaError_t e = cuda_.cudaMemset(*ptr, 0, bytes); e != cudaSuccess) return cuda_fail("cudaMemset", e);
    return Status::Ok();
  }

  void release(void* ptr) override {
    if (ptr) (void)cuda_.cudaFree(ptr);
  }

  Status ready(size_t b) override {
    if (b >= ready_.size()) return Internal(state_->where() + "bucket " + std::to_string(b) + " has no event");
    if (cudaError_t e = cuda_.cudaEventRecord(ready_[b], producer_); e != cudaSuccess)
      return cuda_fail("cudaEventRecord on the gradients' stream", e);
    return Status::Ok();
  }

  Status wait_ready(size_t b) override {
    if (b >= ready_.size()) return Internal(state_->where() + "bucket " + std::to_string(b) + " has no event");
    if (cudaError_t e = cuda_.cudaStreamWaitEvent(stream_, ready_[b], 0); e != cudaSuccess)
      return cuda_fail("cudaStreamWaitEvent (the engine's stream after the gradients)", e);
    return Status::Ok();
  }

  Status copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return Status::Ok();
    if (cudaError_t e = cuda_.cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_); e != cudaSuccess)
      return cuda_fail("cudaMemcpyAsync of a gradient", e);
    return Status::Ok();
  }

  Status zero(void* ptr, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    if (cudaError_t e = cuda_.cudaMemsetAsync(ptr, 0, bytes, stream_); e != cudaSuccess)
      return cuda_fail("cudaMemsetAsync of an unused gradient's slot", e);
    return Status::Ok();
  }

  Status join() override {
    if (cudaError_t e = cuda_.cudaEventRecord(done_, stream_); e != cudaSuccess)
      return cuda_fail("cudaEventRecord on the engine's stream", e);
    if (cudaError_t e = cuda_.cudaStreamWaitEvent(producer_, done_, 0); e != cudaSuccess)
      return cuda_fail("cudaStreamWaitEvent (the gradients' stream after the engine's)", e);
    return Status::Ok();
  }

  Status synchronize(const char* what) override {
    if (cudaError_t e = cuda_.cudaEventRecord(done_, stream_); e != cudaSuccess)
      return cuda_fail("cudaEventRecord on the engine's stream", e);
    return state_->wait_event(done_, what);
  }

 private:
  Status cuda_fail(const std::string& what, cudaError_t e) const {
    (void)cuda_.cudaGetLastError();
    return SystemError(state_->where() + "the engine's " + what + " failed: " + cuda_.error_text(e));
  }

  // The communicator's device state: used only while the communicator lives (the engine destroys
  // it last); the CUDA table lives as long as the process, so the buckets' memory can be freed
  // after the communicator is gone.
  State* state_;
  const CudaLibrary& cuda_;
  cudaStream_t producer_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  std::vector<cudaEvent_t> ready_;
  int device_ = 0;
  std::string why_;
};

}  // namespace

Status open_engine_streams(comm_t c, comm_stream_t producer, std::unique_ptr<EngineStreams>* out) {
  if (!c->device) {
    // Every rank creates its engine together: the path (NCCL, staged, unavailable) is decided
    // now, on the current device, so that a rank without CUDA fails here on every rank.
    std::shared_ptr<State> s;
    COMM_RETURN_IF_ERROR(decide(c, -1, &s));
    c->device = std::move(s);
  }
  State* s = c->device.get();
  if (s->path == State::Path::kUnavailable)
    return Unavailable(s->why + "; device gradients (a non-NULL stream in comm_engine_config_t) cannot run here. "
                                "Pass stream = NULL with host gradients");
  auto streams = std::make_unique<CudaEngineStreams>(s, static_cast<cudaStream_t>(producer));
  COMM_RETURN_IF_ERROR(streams->open());
  *out = std::move(streams);
  return Status::Ok();
}

}  // namespace comm::device

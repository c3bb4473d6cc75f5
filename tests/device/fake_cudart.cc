// A CUDA runtime without a GPU, for the no-GPU tests of the staged path: "device" memory is
// host memory this library hands out and recognises, copies are memcpy, streams and events are
// always complete. Loaded through COMM_CUDA_LIBRARY exactly as libcudart.so.13 would be.
// Stream order is recorded for the engine's tests: each event remembers the stream it was last
// recorded on, and fake_cuda_waits(waiter, on) counts cudaStreamWaitEvent calls that made stream
// `waiter` wait for an event last recorded on another stream `on` (NULL: any stream).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace {
std::mutex mu;
struct Block {
  char* base;
  size_t size;
  int device;
};
std::vector<Block> device_blocks;
thread_local int current_device = 0;  // cudaSetDevice per thread, as the runtime does
int hang = 0;                         // fake_cuda_hang(1): events never complete
std::map<const void*, const void*> recorded_on;                 // event -> stream
std::vector<std::pair<const void*, const void*>> stream_waits;  // (waiter, the event's stream)

int device_of(const void* p) {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& b : device_blocks)
    if (static_cast<const char*>(p) >= b.base && static_cast<const char*>(p) < b.base + b.size) return b.device;
  return -1;
}
bool is_device(const void* p) { return device_of(p) >= 0; }
}  // namespace

extern "C" {
#define FAKE __attribute__((visibility("default")))
FAKE cudaError_t cudaGetDeviceCount(int* n) { *n = 1; return cudaSuccess; }
FAKE cudaError_t cudaDriverGetVersion(int* v) { *v = 13000; return cudaSuccess; }
FAKE cudaError_t cudaRuntimeGetVersion(int* v) { *v = 13000; return cudaSuccess; }
FAKE const char* cudaGetErrorString(cudaError_t) { return "fake CUDA error"; }
FAKE cudaError_t cudaGetLastError(void) { return cudaSuccess; }
FAKE cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  std::memset(a, 0, sizeof *a);
  a->type = is_device(p) ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
  a->device = is_device(p) ? device_of(p) : -2;
  return cudaSuccess;
}
FAKE cudaError_t cudaGetDevice(int* d) { *d = current_device; return cudaSuccess; }
FAKE cudaError_t cudaSetDevice(int d) { current_device = d; return cudaSuccess; }
FAKE cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int d) {
  std::snprintf(id, static_cast<size_t>(len), "0000:fa:%02x.0", d);
  return cudaSuccess;
}
FAKE void fake_cuda_hang(int on) { hang = on; }
FAKE cudaError_t cudaMallocHost(void** p, size_t n) { *p = std::malloc(n); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
FAKE cudaError_t cudaFreeHost(void* p) { std::free(p); return cudaSuccess; }
FAKE cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::malloc(n ? n : 1);
  std::lock_guard<std::mutex> lock(mu);
  device_blocks.push_back({static_cast<char*>(*p), n ? n : 1, current_device});
  return cudaSuccess;
}
FAKE cudaError_t cudaMallocManaged(void** p, size_t n, unsigned) { return cudaMalloc(p, n); }
FAKE cudaError_t cudaFree(void* p) {
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < device_blocks.size(); ++i)
    if (device_blocks[i].base == p) device_blocks.erase(device_blocks.begin() + static_cast<long>(i));
  std::free(p);
  return cudaSuccess;
}
FAKE cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) { std::memmove(d, s, n); return cudaSuccess; }
FAKE cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) { std::memmove(d, s, n); return cudaSuccess; }
FAKE cudaError_t cudaMemset(void* d, int v, size_t n) { std::memset(d, v, n); return cudaSuccess; }
FAKE cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) { std::memset(d, v, n); return cudaSuccess; }
FAKE cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { *e = reinterpret_cast<cudaEvent_t>(std::malloc(8)); return cudaSuccess; }
FAKE cudaError_t cudaEventDestroy(cudaEvent_t e) {
  {
    std::lock_guard<std::mutex> lock(mu);
    recorded_on.erase(e);
  }
  std::free(e);
  return cudaSuccess;
}
FAKE cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  std::lock_guard<std::mutex> lock(mu);
  recorded_on[e] = s;
  return cudaSuccess;
}
FAKE cudaError_t cudaEventQuery(cudaEvent_t) { return hang ? cudaErrorNotReady : cudaSuccess; }
FAKE cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = recorded_on.find(e);
  stream_waits.emplace_back(s, it == recorded_on.end() ? nullptr : it->second);
  return cudaSuccess;
}
FAKE int fake_cuda_waits(const void* waiter, const void* on) {
  std::lock_guard<std::mutex> lock(mu);
  int n = 0;
  for (const auto& [w, o] : stream_waits)
    if (o != nullptr && o != w && (waiter == nullptr || w == waiter) && (on == nullptr || o == on)) ++n;
  return n;
}
FAKE cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { *s = reinterpret_cast<cudaStream_t>(std::malloc(8)); return cudaSuccess; }
FAKE cudaError_t cudaStreamDestroy(cudaStream_t s) { std::free(s); return cudaSuccess; }
FAKE cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
}

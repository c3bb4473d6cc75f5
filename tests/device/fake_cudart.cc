// A CUDA runtime without a GPU, for the no-GPU tests of the staged path: "device" memory is
// host memory this library hands out and recognises, copies are memcpy, streams and events are
// always complete. Loaded through COMM_CUDA_LIBRARY exactly as libcudart.so.13 would be.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
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
FAKE cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { *e = reinterpret_cast<cudaEvent_t>(std::malloc(8)); return cudaSuccess; }
FAKE cudaError_t cudaEventDestroy(cudaEvent_t e) { std::free(e); return cudaSuccess; }
FAKE cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
FAKE cudaError_t cudaEventQuery(cudaEvent_t) { return hang ? cudaErrorNotReady : cudaSuccess; }
FAKE cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
FAKE cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { *s = reinterpret_cast<cudaStream_t>(std::malloc(8)); return cudaSuccess; }
FAKE cudaError_t cudaStreamDestroy(cudaStream_t s) { std::free(s); return cudaSuccess; }
FAKE cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
}

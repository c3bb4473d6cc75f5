// A CUDA runtime without a GPU, for the no-GPU tests of the staged path: "device" memory is
// host memory this library hands out and recognises, copies are memcpy, streams and events are
// always complete. Loaded through COMM_CUDA_LIBRARY exactly as libcudart.so.13 would be.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

namespace {
std::mutex mu;
std::vector<std::pair<char*, size_t>> device_blocks;

bool is_device(const void* p) {
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [base, size] : device_blocks)
    if (static_cast<const char*>(p) >= base && static_cast<const char*>(p) < base + size) return true;
  return false;
}
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
  a->device = is_device(p) ? 0 : -2;
  return cudaSuccess;
}
FAKE cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
FAKE cudaError_t cudaSetDevice(int) { return cudaSuccess; }
FAKE cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int) { std::strncpy(id, "0000:fa:ke.0", static_cast<size_t>(len)); return cudaSuccess; }
FAKE cudaError_t cudaMallocHost(void** p, size_t n) { *p = std::malloc(n); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
FAKE cudaError_t cudaFreeHost(void* p) { std::free(p); return cudaSuccess; }
FAKE cudaError_t cudaMalloc(void** p, size_t n) {
  *p = std::malloc(n ? n : 1);
  std::lock_guard<std::mutex> lock(mu);
  device_blocks.emplace_back(static_cast<char*>(*p), n ? n : 1);
  return cudaSuccess;
}
FAKE cudaError_t cudaMallocManaged(void** p, size_t n, unsigned) { return cudaMalloc(p, n); }
FAKE cudaError_t cudaFree(void* p) {
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < device_blocks.size(); ++i)
    if (device_blocks[i].first == p) device_blocks.erase(device_blocks.begin() + static_cast<long>(i));
  std::free(p);
  return cudaSuccess;
}
FAKE cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) { std::memmove(d, s, n); return cudaSuccess; }
FAKE cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) { std::memmove(d, s, n); return cudaSuccess; }
FAKE cudaError_t cudaMemset(void* d, int v, size_t n) { std::memset(d, v, n); return cudaSuccess; }
FAKE cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { *e = reinterpret_cast<cudaEvent_t>(std::malloc(8)); return cudaSuccess; }
FAKE cudaError_t cudaEventDestroy(cudaEvent_t e) { std::free(e); return cudaSuccess; }
FAKE cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
FAKE cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
FAKE cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
FAKE cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { *s = reinterpret_cast<cudaStream_t>(std::malloc(8)); return cudaSuccess; }
FAKE cudaError_t cudaStreamDestroy(cudaStream_t s) { std::free(s); return cudaSuccess; }
FAKE cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
}

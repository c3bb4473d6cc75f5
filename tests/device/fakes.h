// The no-GPU device tests' helpers: the environment set for one test, and the fake CUDA
// runtime's and fake NCCL's own calls (the same libraries libcomm opened through
// COMM_CUDA_LIBRARY / COMM_NCCL_LIBRARY).
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "comm/comm.h"
#include "../support/env_guard.h"

namespace devtest {


// Any non-NULL value is a stream to the fake runtime; the real one never sees it here.
inline comm_stream_t const kStream = reinterpret_cast<comm_stream_t>(0x5);

// The fake runtime's cudaMalloc/cudaFree (the same library libcomm opened).
struct FakeDevice {
  void* lib = dlopen(FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
  int (*malloc_fn)(void**, size_t) = reinterpret_cast<int (*)(void**, size_t)>(dlsym(lib, "cudaMalloc"));
  int (*free_fn)(void*) = reinterpret_cast<int (*)(void*)>(dlsym(lib, "cudaFree"));
  float* alloc(size_t n) {
    void* p = nullptr;
    malloc_fn(&p, n * sizeof(float));
    return static_cast<float*>(p);
  }
};

struct FakeNccl {
  void* lib = dlopen(FAKE_NCCL, RTLD_NOW | RTLD_LOCAL);
  template <typename F>
  F fn(const char* name) { return reinterpret_cast<F>(dlsym(lib, name)); }
  int count(const char* name) { return fn<int (*)()>(name)(); }
  void set_async_error(int e) { fn<void (*)(int)>("fake_nccl_set_async_error")(e); }
};

inline void fake_set_device(int d) {
  void* lib = dlopen(FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
  reinterpret_cast<int (*)(int)>(dlsym(lib, "cudaSetDevice"))(d);
}

// Stream waits the fake runtime saw: `waiter` waiting for an event last recorded on another
// stream `on` (NULL: any).
inline int fake_waits(const void* waiter, const void* on) {
  void* lib = dlopen(FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
  return reinterpret_cast<int (*)(const void*, const void*)>(dlsym(lib, "fake_cuda_waits"))(waiter, on);
}

}  // namespace devtest

#include "dl/cuda_library.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>

namespace comm::dl {
namespace {

// The majors libcomm knows how to call (the runtime API used here is stable across them).
constexpr const char* kRuntimeNames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"};

template <typename F>
bool resolve(void* lib, F* fn, const char* symbol, std::string* missing) {
  *fn = reinterpret_cast<F>(dlsym(lib, symbol));
  if (*fn == nullptr) *missing += (missing->empty() ? "" : ", ") + std::string(symbol);
  return *fn != nullptr;
}

std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

void load(CudaLibrary* c, const std::string& override_path) {
  void* lib = nullptr;
  std::string tried;
  if (!override_path.empty()) {
    lib = dlopen(override_path.c_str(), RTLD_NOW | RTLD_LOCAL);
    tried = override_path + " (COMM_CUDA_LIBRARY)";
    if (lib) c->path = override_path;
  } else {
    for (const char* name : kRuntimeNames) {
      tried += (tried.empty() ? "" : ", ") + std::string(name);
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib) {
        c->path = name;
        break;
      }
    }
  }
  if (lib == nullptr) {
    c->why_not = "CUDA runtime library not found (tried " + tried +
                 "); install the CUDA runtime or add its folder to LD_LIBRARY_PATH";
    return;
  }
  std::string missing;
#define COMM_RESOLVE(name) resolve(lib, &c->name, #name, &missing)
  COMM_RESOLVE(cudaGetDeviceCount);
  COMM_RESOLVE(cudaDriverGetVersion);
  COMM_RESOLVE(cudaRuntimeGetVersion);
  COMM_RESOLVE(cudaGetErrorString);
  COMM_RESOLVE(cudaGetLastError);
  COMM_RESOLVE(cudaPointerGetAttributes);
  COMM_RESOLVE(cudaGetDevice);
  COMM_RESOLVE(cudaSetDevice);
  COMM_RESOLVE(cudaDeviceGetPCIBusId);
  COMM_RESOLVE(cudaMallocHost);
  COMM_RESOLVE(cudaFreeHost);
  COMM_RESOLVE(cudaMalloc);
  COMM_RESOLVE(cudaMallocManaged);
  COMM_RESOLVE(cudaFree);
  COMM_RESOLVE(cudaMemcpy);
  COMM_RESOLVE(cudaMemcpyAsync);
  COMM_RESOLVE(cudaMemset);
  COMM_RESOLVE(cudaMemsetAsync);
  COMM_RESOLVE(cudaEventCreateWithFlags);
  COMM_RESOLVE(cudaEventDestroy);
  COMM_RESOLVE(cudaEventRecord);
  COMM_RESOLVE(cudaEventQuery);
  COMM_RESOLVE(cudaStreamWaitEvent);
  COMM_RESOLVE(cudaStreamCreateWithFlags);
  COMM_RESOLVE(cudaStreamDestroy);
  COMM_RESOLVE(cudaStreamSynchronize);
#undef COMM_RESOLVE
  if (!missing.empty()) {
    c->why_not = c->path + " lacks " + missing + " (a CUDA runtime older than 11?)";
    return;
  }
  (void)c->cudaRuntimeGetVersion(&c->runtime_version);
  // The runtime says "insufficient driver" both without a driver and with an old one; the
  // driver's CUDA version (0: no driver) tells the two apart for the message.
  (void)c->cudaDriverGetVersion(&c->driver_version);
  int n = 0;
  cudaError_t e = c->cudaGetDeviceCount(&n);
  (void)c->cudaGetLastError();  // a failed query must not stick to the next call
  c->driver_present = c->driver_version > 0;
  if (!c->driver_present && e != cudaSuccess) {
    c->why_not = "no CUDA device: no NVIDIA driver is installed (libcuda.so.1 not found or not loadable)";
    return;
  }
  // Minor versions are compatible within a major (CUDA's minor version compatibility).
  if (e == cudaErrorInsufficientDriver || (c->driver_version > 0 && c->driver_version / 1000 < c->runtime_version / 1000)) {
    c->why_not = "driver too old: " + c->path + " is CUDA " + version_text(c->runtime_version) +
                 " but the driver supports CUDA " + version_text(c->driver_version) +
                 "; update the driver or point COMM_CUDA_LIBRARY at an older runtime";
    return;
  }
  if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)) {
    c->why_not = "no CUDA device (the driver sees none; check CUDA_VISIBLE_DEVICES and nvidia-smi)";
    return;
  }
  if (e != cudaSuccess) {
    c->why_not = "no usable CUDA device: cudaGetDeviceCount failed with " + c->error_text(e);
    return;
  }
  c->devices = n;
}

}  // namespace

std::string CudaLibrary::error_text(cudaError_t e) const {
  const char* text = cudaGetErrorString ? cudaGetErrorString(e) : nullptr;
  return "CUDA error " + std::to_string(static_cast<int>(e)) + (text ? std::string(" (") + text + ")" : "");
}

const CudaLibrary& cuda_library(const std::string& override_path) {
  static std::mutex mu;
  static auto* loaded = new std::map<std::string, std::unique_ptr<CudaLibrary>>;  // never freed: used until exit
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*loaded)[override_path];
  if (!slot) {
    slot = std::make_unique<CudaLibrary>();
    load(slot.get(), override_path);
  }
  return *slot;
}

}  // namespace comm::dl

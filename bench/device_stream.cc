#include "device_stream.h"

#if defined(COMM_HAVE_CUDA_HEADERS) && defined(COMM_HAVE_NCCL_HEADERS)
#include <cstdlib>

#include "dl/cuda_library.h"

namespace bench {
namespace {
const comm::dl::CudaLibrary& cuda() {
  const char* path = std::getenv("COMM_CUDA_LIBRARY");
  return comm::dl::cuda_library(path ? path : "");
}
}  // namespace

DeviceStream::~DeviceStream() {
  if (stream_ && owned_) (void)cuda().cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

std::string DeviceStream::open(bool default_stream) {
  const auto& c = cuda();
  if (!c.usable()) return "--device 1 needs CUDA: " + c.why_not;
  if (default_stream) {  // -y 1; NULL would mean host buffers to libcomm, so the legacy stream's handle
    stream_ = cudaStreamLegacy;
    open_ = true;
    return "";
  }
  owned_ = true;
  cudaStream_t s = nullptr;
  if (cudaError_t e = c.cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess)
    return "cudaStreamCreate failed: " + c.error_text(e);
  stream_ = s;
  open_ = true;
  return "";
}

void* DeviceStream::alloc(size_t bytes, std::string* error) {
  void* p = nullptr;
  if (cudaError_t e = cuda().cudaMallocManaged(&p, bytes ? bytes : 1, cudaMemAttachGlobal); e != cudaSuccess) {
    *error = "cudaMallocManaged(" + std::to_string(bytes) + ") failed: " + cuda().error_text(e);
    return nullptr;
  }
  return p;
}

void DeviceStream::release(void* p) { (void)cuda().cudaFree(p); }

bool DeviceStream::copy(void* dst, const void* src, size_t bytes, std::string* error) {
  if (bytes == 0) return true;
  cudaError_t e = cuda().cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream_));
  if (e != cudaSuccess) *error = "cudaMemcpyAsync failed: " + cuda().error_text(e);
  return e == cudaSuccess;
}

bool DeviceStream::sync(std::string* error) {
  if (cudaError_t e = cuda().cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)); e != cudaSuccess) {
    *error = "cudaStreamSynchronize failed: " + cuda().error_text(e);
    return false;
  }
  return true;
}

}  // namespace bench
#else
namespace bench {
DeviceStream::~DeviceStream() = default;
std::string DeviceStream::open(bool) { return "--device 1: comm-bench was built without the CUDA/NCCL headers"; }
void* DeviceStream::alloc(size_t, std::string*) { return nullptr; }
void DeviceStream::release(void*) {}
bool DeviceStream::copy(void*, const void*, size_t, std::string*) { return false; }
bool DeviceStream::sync(std::string*) { return false; }
}  // namespace bench
#endif

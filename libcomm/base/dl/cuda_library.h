// The CUDA runtime, opened with dlopen by its versioned name (libcudart.so.<major>), so that one
// libcomm.so runs on machines with and without CUDA. Only compiled with the CUDA headers; the
// table's types come from cuda_runtime_api.h, so a signature can never drift from the library.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace comm::dl {

struct CudaLibrary {
  std::string path;       // the name dlopen succeeded with ("" when none)
  std::string why_not;    // why it cannot be used ("" when it can)
  bool driver_present = false;  // libcuda.so.1 (the driver) could be opened
  int runtime_version = 0;      // 13000 for 13.0
  int driver_version = 0;       // the CUDA version the driver supports, 0 without a driver
  int devices = 0;

#define COMM_CUDA_FN(name) decltype(&::name) name = nullptr
  COMM_CUDA_FN(cudaGetDeviceCount);
  COMM_CUDA_FN(cudaDriverGetVersion);
  COMM_CUDA_FN(cudaRuntimeGetVersion);
  COMM_CUDA_FN(cudaGetErrorString);
  COMM_CUDA_FN(cudaGetLastError);
  COMM_CUDA_FN(cudaPointerGetAttributes);
  COMM_CUDA_FN(cudaGetDevice);
  COMM_CUDA_FN(cudaSetDevice);
  COMM_CUDA_FN(cudaDeviceGetPCIBusId);
  COMM_CUDA_FN(cudaMallocHost);
  COMM_CUDA_FN(cudaFreeHost);
  COMM_CUDA_FN(cudaMalloc);
  COMM_CUDA_FN(cudaMallocManaged);
  COMM_CUDA_FN(cudaFree);
  COMM_CUDA_FN(cudaMemcpy);
  COMM_CUDA_FN(cudaMemcpyAsync);
  COMM_CUDA_FN(cudaMemset);
  COMM_CUDA_FN(cudaMemsetAsync);
  COMM_CUDA_FN(cudaEventCreateWithFlags);
  COMM_CUDA_FN(cudaEventDestroy);
  COMM_CUDA_FN(cudaEventRecord);
  COMM_CUDA_FN(cudaEventQuery);
  COMM_CUDA_FN(cudaStreamWaitEvent);
  COMM_CUDA_FN(cudaStreamCreateWithFlags);
  COMM_CUDA_FN(cudaStreamDestroy);
  COMM_CUDA_FN(cudaStreamSynchronize);
#undef COMM_CUDA_FN

  bool usable() const { return why_not.empty(); }
  // "cudaErrorNoDevice (no CUDA-capable device is detected)"
  std::string error_text(cudaError_t e) const;
};

// Opens the runtime once per name and keeps it for the life of the process. `override_path`
// (COMM_CUDA_LIBRARY) replaces the search: libcudart.so.13, .12, .11, in that order. The result
// says which library was found, whether the driver is there and new enough, how many devices.
const CudaLibrary& cuda_library(const std::string& override_path);

}  // namespace comm::dl

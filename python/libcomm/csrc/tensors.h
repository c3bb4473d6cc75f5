// Tensors as python/libcomm/csrc/process_group_libcomm.cc hands them to comm.h: dtype and op
// mapping, and the contiguous copy of a strided tensor. A header of that one translation unit.
#pragma once

#include <comm/comm.h>

#include <torch/csrc/distributed/c10d/Types.hpp>

#include <ATen/ATen.h>

#include <vector>

namespace libcomm_torch {

inline comm_dtype_t to_comm_dtype(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "libcomm ", what, ": undefined tensor");
  TORCH_CHECK(!t.is_cuda(),
              "libcomm ", what, ": CUDA tensors are not supported by this build (torch 1.13 from Debian "
              "is CPU-only, so the extension has no CUDA stream to hand to comm.h); see docs/torch-backend.md");
  TORCH_CHECK(t.device().is_cpu() && t.layout() == at::kStrided,
              "libcomm ", what, ": only dense CPU tensors are supported, got ", t.device(), " ", t.layout());
  switch (t.scalar_type()) {
    case at::kFloat: return COMM_FLOAT32;
    case at::kDouble: return COMM_FLOAT64;
    case at::kHalf: return COMM_FLOAT16;
    case at::kBFloat16: return COMM_BFLOAT16;
    case at::kChar: return COMM_INT8;
    case at::kByte: return COMM_UINT8;
    case at::kInt: return COMM_INT32;
    case at::kLong: return COMM_INT64;
    default:
      TORCH_CHECK(false, "libcomm ", what, ": dtype ", t.scalar_type(),
                  " is not supported (libcomm has float32/64, float16, bfloat16, int8, uint8, int32, int64)");
  }
}

inline comm_op_t to_comm_op(const c10d::ReduceOp& op, const char* what) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return COMM_SUM;
    case c10d::ReduceOp::PRODUCT: return COMM_PROD;
    case c10d::ReduceOp::MIN: return COMM_MIN;
    case c10d::ReduceOp::MAX: return COMM_MAX;
    case c10d::ReduceOp::AVG: return COMM_AVG;
    default:
      TORCH_CHECK(false, "libcomm ", what, ": reduce op ", static_cast<int>(op.op_),
                  " (BAND, BOR, BXOR or PREMUL_SUM) is not supported; libcomm has SUM, PRODUCT, MIN, MAX, AVG");
  }
}

// A tensor as libcomm sees it: its contiguous storage, copied back at the end when the caller's
// tensor was not contiguous (what gloo does).
struct Buf {
  at::Tensor user, dense;
  comm_dtype_t dtype;
  Buf(const at::Tensor& t, const char* what) : user(t), dense(t.contiguous()), dtype(to_comm_dtype(t, what)) {}
  void* ptr() const { return dense.data_ptr(); }
  size_t count() const { return static_cast<size_t>(dense.numel()); }
  void copy_back() {
    if (!dense.is_same(user)) user.copy_(dense);
  }
};

inline at::Tensor single(const std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(tensors.size() == 1, "libcomm ", what, ": expects one tensor per rank, got ", tensors.size());
  return tensors[0];
}

}  // namespace libcomm_torch

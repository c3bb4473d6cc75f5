// Sparse all-reduce (sum) of python/libcomm/csrc/process_group_libcomm.cc, gloo's approach: every
// rank's coalesced indices and values are gathered to every rank, concatenated in rank order and
// coalesced, which sums the entries that share an index. Every rank computes the same thing from
// the same data, so the results are bitwise identical. comm.h has no all-gather of varying
// counts, so each rank's part is padded to the largest nnz and the padding dropped after.
#pragma once

#include <comm/comm.h>

#include <ATen/ATen.h>

#include "work_queue.h"

#include <array>
#include <vector>

namespace libcomm_torch {

// Runs on the executor (the one thread using `comm`). Returns the coalesced sum.
inline at::Tensor sparse_allreduce_sum(comm_t comm, int size, const at::Tensor& in, comm_dtype_t value_dtype) {
  at::Tensor input = in.coalesce();
  const int64_t nnz = input._nnz(), sparse_dim = input.sparse_dim(), dense_dim = input.dense_dim();
  // What every rank must agree on, and each rank's nnz.
  std::array<int64_t, 4> meta = {nnz, sparse_dim, dense_dim, input.numel()};
  std::vector<int64_t> all_meta(meta.size() * static_cast<size_t>(size));
  check(comm_allgather(comm, meta.data(), all_meta.data(), meta.size(), COMM_INT64, nullptr),
        "allreduce (sparse: sizes)");
  int64_t max_nnz = 0;
  for (int r = 0; r < size; ++r) {
    const int64_t* m = &all_meta[meta.size() * static_cast<size_t>(r)];
    TORCH_CHECK(m[1] == sparse_dim && m[2] == dense_dim && m[3] == input.numel(),
                "libcomm allreduce (sparse): rank ", r, " has a tensor of sparse_dim ", m[1], ", dense_dim ", m[2],
                " and ", m[3], " elements; this rank's has ", sparse_dim, ", ", dense_dim, " and ", input.numel());
    max_nnz = std::max(max_nnz, m[0]);
  }
  at::Tensor indices = at::zeros({sparse_dim, max_nnz}, input._indices().options().dtype(at::kLong));
  indices.narrow(1, 0, nnz).copy_(input._indices());
  std::vector<int64_t> value_shape = input._values().sizes().vec();
  value_shape[0] = max_nnz;
  at::Tensor values = at::zeros(value_shape, input._values().options());
  values.narrow(0, 0, nnz).copy_(input._values());

  std::vector<int64_t> all_index_shape = {size, sparse_dim, max_nnz}, all_value_shape = value_shape;
  all_value_shape.insert(all_value_shape.begin(), size);
  at::Tensor all_indices = at::empty(all_index_shape, indices.options());
  at::Tensor all_values = at::empty(all_value_shape, values.options());
  check(comm_allgather(comm, indices.data_ptr(), all_indices.data_ptr(), static_cast<size_t>(indices.numel()), COMM_INT64,
                       nullptr),
        "allreduce (sparse: indices)");
  check(comm_allgather(comm, values.data_ptr(), all_values.data_ptr(), static_cast<size_t>(values.numel()), value_dtype,
                       nullptr),
        "allreduce (sparse: values)");

  std::vector<at::Tensor> parts_i, parts_v;
  for (int r = 0; r < size; ++r) {
    const int64_t n = all_meta[meta.size() * static_cast<size_t>(r)];
    parts_i.push_back(all_indices[r].narrow(1, 0, n));
    parts_v.push_back(all_values[r].narrow(0, 0, n));
  }
  return at::sparse_coo_tensor(at::cat(parts_i, 1), at::cat(parts_v, 0), input.sizes(), input.options()).coalesce();
}

}  // namespace libcomm_torch

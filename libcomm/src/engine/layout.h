// Bucket assignment: a pure function of the parameter list, the fill order and the caps, so
// every rank that runs it on the same input builds the same buckets (and tests can pin it).
#pragma once

#include <cstddef>
#include <vector>

#include "comm/comm.h"

namespace comm::engine {

struct ParamInfo {
  size_t count = 0;
  comm_dtype_t dtype = COMM_FLOAT32;
};

struct BucketLayout {
  comm_dtype_t dtype = COMM_FLOAT32;
  std::vector<int> params;     // in fill order
  std::vector<size_t> offset;  // each parameter's first element inside the bucket
  size_t count = 0;            // elements
};

// Fills buckets taking parameters in `order` (every index exactly once): one open bucket per
// dtype; a parameter that would take its bucket past the limit closes it first, so a bucket
// exceeds the limit only when one parameter alone does (parameters are never split). The first
// bucket of each dtype has limit first_bytes (communication starts early), the rest cap_bytes.
// Buckets are numbered in the order they were opened: the order they are issued in.
std::vector<BucketLayout> assign_buckets(const std::vector<ParamInfo>& params, const std::vector<int>& order,
                                         size_t cap_bytes, size_t first_bytes);

// Reverse registration order: backward produces the last layer's gradient first.
std::vector<int> reverse_order(size_t num_params);

}  // namespace comm::engine

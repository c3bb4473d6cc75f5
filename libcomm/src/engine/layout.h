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

// A piece of one bucket that is all-reduced on its own: elements [begin, begin + count) of the
// bucket's flat storage, and the parameters whose elements it holds (a parameter larger than a
// partition is in several).
struct PartitionLayout {
  int bucket = 0;
  size_t begin = 0, count = 0;
  std::vector<int> params;  // in bucket order
  int priority = 0;         // lowest priority of its parameters (lower = needed sooner by forward)
};

// Cuts each bucket into partitions of at most partition_bytes (of the bucket's dtype; at least one
// element): parameters are packed whole while they fit, a parameter larger than a partition is
// split into equal pieces of its own. Every bucket gets at least one partition and every parameter
// (a zero-sized one too) is in at least one. Partitions are numbered bucket by bucket, in offset
// order: the FIFO order. priority[p] is parameter p's priority.
std::vector<PartitionLayout> cut_partitions(const std::vector<BucketLayout>& buckets,
                                            const std::vector<ParamInfo>& params,
                                            const std::vector<int>& priority, size_t partition_bytes);

// Reverse registration order: backward produces the last layer's gradient first.
std::vector<int> reverse_order(size_t num_params);

}  // namespace comm::engine

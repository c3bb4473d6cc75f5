// Wire compression of float32 buckets: fp16 or bf16 on the wire, round to nearest even.
#pragma once

#include <cstddef>

#include "comm/comm.h"

namespace comm::engine {

// dst (wire dtype) <- src (float32), n elements.
void compress(const float* src, void* dst, size_t n, comm_dtype_t wire);
// dst (float32) <- src (wire dtype), n elements.
void decompress(const void* src, float* dst, size_t n, comm_dtype_t wire);

}  // namespace comm::engine

#include "engine/wire.h"

#include <cstdint>

#include "dtype.h"

namespace comm::engine {

void compress(const float* src, void* dst, size_t n, comm_dtype_t wire) {
  auto* out = static_cast<uint16_t*>(dst);
  if (wire == COMM_FLOAT16) {
    for (size_t i = 0; i < n; ++i) out[i] = float_to_half(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(src[i]);
  }
}

void decompress(const void* src, float* dst, size_t n, comm_dtype_t wire) {
  const auto* in = static_cast<const uint16_t*>(src);
  if (wire == COMM_FLOAT16) {
    for (size_t i = 0; i < n; ++i) dst[i] = half_to_float(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(in[i]);
  }
}

}  // namespace comm::engine

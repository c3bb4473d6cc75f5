// The references of the reduction tests (tests/core/test_reduce*.cc), sharing no code with the
// implementation (libcomm/src/dtype.h): exact integers (128-bit), float64 arithmetic, fp16/bf16
// values decoded with ldexp and rounded by searching the table of representable values; and the
// buffers, value generators and one-call runner the tests drive the kernels with.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dtype.h"

namespace reduce_test {

__extension__ typedef __int128 i128;
__extension__ typedef unsigned __int128 u128;

inline constexpr comm_dtype_t kDtypes[] = {COMM_FLOAT32, COMM_FLOAT64, COMM_FLOAT16, COMM_BFLOAT16,
                                           COMM_INT8,    COMM_UINT8,   COMM_INT32,   COMM_UINT32,
                                           COMM_INT64,   COMM_UINT64};
inline constexpr comm_op_t kOps[] = {COMM_SUM, COMM_PROD, COMM_MIN, COMM_MAX, COMM_AVG};

bool is_signed_int(comm_dtype_t d);
bool is_int(comm_dtype_t d);

// ---- a typeless buffer of elements, read and written as bit patterns ----
struct Buf {
  comm_dtype_t dt;
  std::vector<unsigned char> bytes;
  Buf(comm_dtype_t d, size_t n) : dt(d), bytes(n * comm::dtype_size(d)) {}
  size_t size() const { return bytes.size() / comm::dtype_size(dt); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  uint64_t get(size_t i) const {
    const unsigned char* p = bytes.data() + i * comm::dtype_size(dt);
    switch (comm::dtype_size(dt)) {
      case 1: return *p;
      case 2: { uint16_t v; std::memcpy(&v, p, 2); return v; }
      case 4: { uint32_t v; std::memcpy(&v, p, 4); return v; }
      default: { uint64_t v; std::memcpy(&v, p, 8); return v; }
    }
  }
  void set(size_t i, uint64_t bits) {
    unsigned char* p = bytes.data() + i * comm::dtype_size(dt);
    switch (comm::dtype_size(dt)) {
      case 1: *p = static_cast<unsigned char>(bits); break;
      case 2: { uint16_t v = static_cast<uint16_t>(bits); std::memcpy(p, &v, 2); break; }
      case 4: { uint32_t v = static_cast<uint32_t>(bits); std::memcpy(p, &v, 4); break; }
      default: std::memcpy(p, &bits, 8); break;
    }
  }
};

std::string hex(uint64_t v);

// ---- independent fp16/bf16 oracle ----
double decode_half_ref(uint16_t h);
double decode_bf16_ref(uint16_t b);

// vals[p] is the value of positive pattern p for p < inf_pattern; vals[inf_pattern] is where
// the exponent would continue (2^16, 2^128), so rounding up to it means overflow to inf.
struct Oracle {
  uint16_t inf_pattern;
  std::vector<double> vals;
  Oracle(uint16_t infp, double (*decode)(uint16_t), double beyond) : inf_pattern(infp) {
    for (uint32_t p = 0; p < infp; ++p) vals.push_back(decode(static_cast<uint16_t>(p)));
    vals.push_back(beyond);
  }
  // Round to nearest, ties to the even pattern. t must not be NaN.
  uint16_t round(double t) const {
    const uint16_t sign = std::signbit(t) ? 0x8000 : 0;
    const double a = std::fabs(t);
    if (a >= vals.back()) return sign | inf_pattern;
    const size_t lo = static_cast<size_t>(std::upper_bound(vals.begin(), vals.end(), a) -
                                          vals.begin()) - 1;
    size_t r = lo;
    if (vals[lo] != a) {
      const double dl = a - vals[lo], dh = vals[lo + 1] - a;
      r = (dl < dh || (dl == dh && lo % 2 == 0)) ? lo : lo + 1;
    }
    return static_cast<uint16_t>(sign | r);
  }
};
const Oracle& half_oracle();
const Oracle& bf16_oracle();

// ---- reference reductions ----
int bits_of(comm_dtype_t d);
i128 int_value(comm_dtype_t d, uint64_t bits);
uint64_t int_wrap(comm_dtype_t d, i128 v);
double float_value(comm_dtype_t d, uint64_t bits);
// Round a float64 to the type. fp32 of a float64 result and fp16/bf16 of a float64 result are
// both double roundings that cannot differ from one rounding for + and * (53 >= 2p + 2).
uint64_t float_bits(comm_dtype_t d, double v);
// Finite, non-NaN inputs only; equal values are identical patterns or +-0.
uint64_t reference(comm_dtype_t d, comm_op_t op, uint64_t a, uint64_t b);

using Rng = std::mt19937_64;

// Values whose float64 reference is exact or provably equal to the kernel's rounding.
uint64_t gen_plain(comm_dtype_t d, Rng& rng);
// Anything, with the awkward values over-represented.
uint64_t gen_wild(comm_dtype_t d, Rng& rng);
Buf random_buf(comm_dtype_t d, size_t n, Rng& rng, uint64_t (*gen)(comm_dtype_t, Rng&));

// out = a op b through the kernel, out of place.
Buf run(comm_dtype_t d, comm_op_t op, const Buf& a, const Buf& b);

template <class... V>
Buf make(comm_dtype_t d, V... v) {
  const uint64_t vals[] = {static_cast<uint64_t>(v)...};
  Buf b(d, sizeof...(V));
  for (size_t i = 0; i < sizeof...(V); ++i) b.set(i, vals[i]);
  return b;
}

uint64_t one_step(comm_dtype_t d, comm_op_t op, uint64_t a, uint64_t b);
bool is_nan_bits(comm_dtype_t d, uint64_t v);

inline uint16_t h(float f) { return comm::float_to_half(f); }
inline uint16_t bf(float f) { return comm::float_to_bf16(f); }
inline float f32(uint32_t bits) { return std::bit_cast<float>(bits); }

}  // namespace reduce_test

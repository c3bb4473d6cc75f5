// The references of the reduction tests (reduce_reference.h): exact integers, float64, and the
// fp16/bf16 oracle built from ldexp, none of it shared with libcomm/src/dtype.cc.
#include "reduce_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace reduce_test {

bool is_signed_int(comm_dtype_t d) {
  return d == COMM_INT8 || d == COMM_INT32 || d == COMM_INT64;
}
bool is_int(comm_dtype_t d) {
  return is_signed_int(d) || d == COMM_UINT8 || d == COMM_UINT32 || d == COMM_UINT64;
}

std::string hex(uint64_t v) {
  char s[32];
  std::snprintf(s, sizeof s, "0x%llx", static_cast<unsigned long long>(v));
  return s;
}

double decode_half_ref(uint16_t h) {
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  double v;
  if (e == 0x1F) v = m ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
  else if (e == 0) v = std::ldexp(m, -24);
  else v = std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}
double decode_bf16_ref(uint16_t b) {
  const int e = (b >> 7) & 0xFF;
  const int m = b & 0x7F;
  double v;
  if (e == 0xFF) v = m ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
  else if (e == 0) v = std::ldexp(m, -133);
  else v = std::ldexp(128 + m, e - 134);
  return (b & 0x8000) ? -v : v;
}

const Oracle& half_oracle() {
  static const Oracle o(0x7C00, decode_half_ref, 65536.0);
  return o;
}
const Oracle& bf16_oracle() {
  static const Oracle o(0x7F80, decode_bf16_ref, std::ldexp(1.0, 128));
  return o;
}

int bits_of(comm_dtype_t d) { return static_cast<int>(comm::dtype_size(d) * 8); }

i128 int_value(comm_dtype_t d, uint64_t bits) {
  const int w = bits_of(d);
  if (w < 64) bits &= (uint64_t{1} << w) - 1;
  if (is_signed_int(d) && (bits >> (w - 1)) & 1) return static_cast<i128>(bits) - (i128{1} << w);
  return static_cast<i128>(bits);
}
uint64_t int_wrap(comm_dtype_t d, i128 v) {
  const int w = bits_of(d);
  const i128 m = i128{1} << w;
  i128 r = v % m;
  if (r < 0) r += m;
  return static_cast<uint64_t>(r);
}

double float_value(comm_dtype_t d, uint64_t bits) {
  switch (d) {
    case COMM_FLOAT32: return std::bit_cast<float>(static_cast<uint32_t>(bits));
    case COMM_FLOAT64: return std::bit_cast<double>(bits);
    case COMM_FLOAT16: return decode_half_ref(static_cast<uint16_t>(bits));
    default: return decode_bf16_ref(static_cast<uint16_t>(bits));
  }
}
uint64_t float_bits(comm_dtype_t d, double v) {
  switch (d) {
    case COMM_FLOAT32: return std::bit_cast<uint32_t>(static_cast<float>(v));
    case COMM_FLOAT64: return std::bit_cast<uint64_t>(v);
    case COMM_FLOAT16: return half_oracle().round(v);
    default: return bf16_oracle().round(v);
  }
}

uint64_t reference(comm_dtype_t d, comm_op_t op, uint64_t a, uint64_t b) {
  if (is_int(d)) {
    const i128 x = int_value(d, a), y = int_value(d, b);
    switch (op) {
      case COMM_SUM: case COMM_AVG: return int_wrap(d, x + y);
      case COMM_PROD:  // exact modulo 2^128, which is all a wrap to 64 bits or fewer needs
        return int_wrap(d, static_cast<i128>(static_cast<u128>(x) * static_cast<u128>(y)));
      case COMM_MIN: return int_wrap(d, x < y ? x : y);
      case COMM_MAX: return int_wrap(d, x > y ? x : y);
    }
  }
  const double x = float_value(d, a), y = float_value(d, b);
  switch (op) {
    case COMM_SUM: case COMM_AVG: return float_bits(d, x + y);
    case COMM_PROD: return float_bits(d, x * y);
    case COMM_MIN: return x < y ? a : y < x ? b : (a | b);
    case COMM_MAX: return x > y ? a : y > x ? b : (a & b);
  }
  return 0;
}

uint64_t gen_plain(comm_dtype_t d, Rng& rng) {
  std::uniform_int_distribution<uint64_t> u;
  switch (d) {
    case COMM_FLOAT32: {
      std::uniform_real_distribution<float> f(-1000.0f, 1000.0f);
      return std::bit_cast<uint32_t>(f(rng));
    }
    case COMM_FLOAT64: {  // k * 2^-10, |k| < 2^20: sums and products are exact in float64
      std::uniform_int_distribution<int64_t> k(-(1 << 20), 1 << 20);
      return std::bit_cast<uint64_t>(std::ldexp(static_cast<double>(k(rng)), -10));
    }
    case COMM_FLOAT16: {  // any finite pattern
      uint16_t h;
      do h = static_cast<uint16_t>(u(rng)); while ((h & 0x7C00) == 0x7C00);
      return h;
    }
    case COMM_BFLOAT16: {  // exponents within 2^+-40, so products stay normal in fp32
      const uint64_t r = u(rng);
      const uint64_t e = 127 - 40 + r % 81;
      return ((r >> 8) & 0x8000) | (e << 7) | ((r >> 20) & 0x7F);
    }
    default: return u(rng);
  }
}

uint64_t gen_wild(comm_dtype_t d, Rng& rng) {
  std::uniform_int_distribution<uint64_t> u;
  const uint64_t r = u(rng);
  if (is_int(d) || r % 2 == 0) return u(rng);
  const uint64_t payload = u(rng);
  const uint64_t sign_pick = (r >> 8) & 1;
  switch (d) {
    case COMM_FLOAT32: {
      const uint64_t s = sign_pick << 31;
      const uint64_t choices[] = {0, 0x7F800000, 0x7FC00000 | (payload & 0x3FFFFF),
                                  0x7F800000 | ((payload & 0x3FFFFF) | 1), 1,
                                  0x007FFFFF, 0x3F800000, 0x7F7FFFFF};
      return s | choices[(r >> 16) % 8];
    }
    case COMM_FLOAT64: {
      const uint64_t s = sign_pick << 63;
      const uint64_t m = payload & 0x7FFFFFFFFFFFFull;
      const uint64_t choices[] = {0, 0x7FF0000000000000ull, 0x7FF8000000000000ull | m,
                                  0x7FF0000000000000ull | m | 1, 1, 0x000FFFFFFFFFFFFFull,
                                  0x3FF0000000000000ull, 0x7FEFFFFFFFFFFFFFull};
      return s | choices[(r >> 16) % 8];
    }
    case COMM_FLOAT16: {
      const uint64_t s = sign_pick << 15;
      const uint64_t choices[] = {0, 0x7C00, 0x7E00 | (payload & 0x1FF),
                                  0x7C00 | ((payload & 0x1FF) | 1), 1, 0x03FF, 0x3C00, 0x7BFF};
      return s | choices[(r >> 16) % 8];
    }
    default: {
      const uint64_t s = sign_pick << 15;
      const uint64_t choices[] = {0, 0x7F80, 0x7FC0 | (payload & 0x3F),
                                  0x7F80 | ((payload & 0x3F) | 1), 1, 0x007F, 0x3F80, 0x7F7F};
      return s | choices[(r >> 16) % 8];
    }
  }
}

Buf random_buf(comm_dtype_t d, size_t n, Rng& rng, uint64_t (*gen)(comm_dtype_t, Rng&)) {
  Buf b(d, n);
  for (size_t i = 0; i < n; ++i) b.set(i, gen(d, rng));
  return b;
}

Buf run(comm_dtype_t d, comm_op_t op, const Buf& a, const Buf& b) {
  Buf out(d, a.size());
  comm::reduce_fn(d, op)(out.data(), a.data(), b.data(), a.size());
  return out;
}

uint64_t one_step(comm_dtype_t d, comm_op_t op, uint64_t a, uint64_t b) {
  return run(d, op, make(d, a), make(d, b)).get(0);
}

bool is_nan_bits(comm_dtype_t d, uint64_t v) {
  switch (d) {
    case COMM_FLOAT32: return (v & 0x7FFFFFFFu) > 0x7F800000u;
    case COMM_FLOAT64: return (v & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull;
    case COMM_FLOAT16: return (v & 0x7FFF) > 0x7C00;
    case COMM_BFLOAT16: return (v & 0x7FFF) > 0x7F80;
    default: return false;
  }
}

}  // namespace reduce_test

// Reduction kernels and fp16/bf16 conversions, checked against references that do not share
// code with the implementation: exact integers (128-bit), float64 arithmetic, and fp16/bf16
// values decoded with ldexp and rounded by searching the table of representable values.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dtype.h"

namespace {

__extension__ typedef __int128 i128;
__extension__ typedef unsigned __int128 u128;

const comm_dtype_t kDtypes[] = {COMM_FLOAT32, COMM_FLOAT64, COMM_FLOAT16, COMM_BFLOAT16,
                                COMM_INT8,    COMM_UINT8,   COMM_INT32,   COMM_UINT32,
                                COMM_INT64,   COMM_UINT64};
const comm_op_t kOps[] = {COMM_SUM, COMM_PROD, COMM_MIN, COMM_MAX, COMM_AVG};

bool is_signed_int(comm_dtype_t d) {
  return d == COMM_INT8 || d == COMM_INT32 || d == COMM_INT64;
}
bool is_int(comm_dtype_t d) {
  return is_signed_int(d) || d == COMM_UINT8 || d == COMM_UINT32 || d == COMM_UINT64;
}

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

std::string hex(uint64_t v) {
  char s[32];
  std::snprintf(s, sizeof s, "0x%llx", static_cast<unsigned long long>(v));
  return s;
}

// ---- independent fp16/bf16 oracle ----
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
const Oracle& half_oracle() {
  static const Oracle o(0x7C00, decode_half_ref, 65536.0);
  return o;
}
const Oracle& bf16_oracle() {
  static const Oracle o(0x7F80, decode_bf16_ref, std::ldexp(1.0, 128));
  return o;
}

// ---- reference reductions ----
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
// Round a float64 to the type. fp32 of a float64 result and fp16/bf16 of a float64 result are
// both double roundings that cannot differ from one rounding for + and * (53 >= 2p + 2).
uint64_t float_bits(comm_dtype_t d, double v) {
  switch (d) {
    case COMM_FLOAT32: return std::bit_cast<uint32_t>(static_cast<float>(v));
    case COMM_FLOAT64: return std::bit_cast<uint64_t>(v);
    case COMM_FLOAT16: return half_oracle().round(v);
    default: return bf16_oracle().round(v);
  }
}

// Finite, non-NaN inputs only; equal values are identical patterns or +-0.
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

using Rng = std::mt19937_64;

// Values whose float64 reference is exact or provably equal to the kernel's rounding.
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

// Anything, with the awkward values over-represented.
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

template <class... V>
Buf make(comm_dtype_t d, V... v) {
  const uint64_t vals[] = {static_cast<uint64_t>(v)...};
  Buf b(d, sizeof...(V));
  for (size_t i = 0; i < sizeof...(V); ++i) b.set(i, vals[i]);
  return b;
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

uint16_t h(float f) { return comm::float_to_half(f); }
uint16_t bf(float f) { return comm::float_to_bf16(f); }
float f32(uint32_t bits) { return std::bit_cast<float>(bits); }

}  // namespace

TEST_CASE("dtype and op metadata cover exactly the enums of comm.h", "[reduce]") {
  const size_t sizes[] = {4, 8, 2, 2, 1, 1, 4, 4, 8, 8};
  const char* names[] = {"float32", "float64", "float16", "bfloat16", "int8",
                         "uint8",   "int32",   "uint32",  "int64",    "uint64"};
  for (int d = 0; d < COMM_NUM_DTYPES; ++d) {
    CHECK(comm::dtype_valid(d));
    CHECK(comm::dtype_size(static_cast<comm_dtype_t>(d)) == sizes[d]);
    CHECK(std::string(comm::dtype_name(static_cast<comm_dtype_t>(d))) == names[d]);
  }
  CHECK_FALSE(comm::dtype_valid(-1));
  CHECK_FALSE(comm::dtype_valid(COMM_NUM_DTYPES));
  const char* ops[] = {"sum", "prod", "min", "max", "avg"};
  for (int o = 0; o < COMM_NUM_OPS; ++o) {
    CHECK(comm::op_valid(o));
    CHECK(std::string(comm::op_name(static_cast<comm_op_t>(o))) == ops[o]);
  }
  CHECK_FALSE(comm::op_valid(-1));
  CHECK_FALSE(comm::op_valid(COMM_NUM_OPS));
  CHECK(comm::reduce_fn(static_cast<comm_dtype_t>(COMM_NUM_DTYPES), COMM_SUM) == nullptr);
  CHECK(comm::reduce_fn(COMM_FLOAT32, static_cast<comm_op_t>(COMM_NUM_OPS)) == nullptr);
}

TEST_CASE("every dtype x op matches a float64 or exact-integer reference", "[reduce]") {
  Rng rng(12345);
  for (comm_dtype_t d : kDtypes) {
    for (comm_op_t op : kOps) {
      INFO(comm::dtype_name(d) << " " << comm::op_name(op));
      const size_t n = 300;
      const Buf a = random_buf(d, n, rng, gen_plain);
      const Buf b = random_buf(d, n, rng, gen_plain);
      const Buf out = run(d, op, a, b);
      size_t wrong = 0;
      for (size_t i = 0; i < n; ++i) {
        const uint64_t want = reference(d, op, a.get(i), b.get(i));
        if (out.get(i) != want && ++wrong <= 3) {
          FAIL_CHECK("element " << i << ": " << hex(a.get(i)) << " op " << hex(b.get(i))
                                << " gave " << hex(out.get(i)) << ", want " << hex(want));
        }
      }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("integer sum and prod wrap around two's complement", "[reduce]") {
  CHECK(one_step(COMM_INT32, COMM_SUM, INT32_MAX, 1) == static_cast<uint32_t>(INT32_MIN));
  CHECK(one_step(COMM_UINT8, COMM_PROD, 200, 2) == 144);
  CHECK(one_step(COMM_UINT8, COMM_SUM, 200, 100) == 44);
  CHECK(one_step(COMM_INT8, COMM_SUM, 127, 1) == 0x80);                       // -128
  CHECK(one_step(COMM_INT8, COMM_PROD, 0x80, 0xFF) == 0x80);                  // -128 * -1
  CHECK(one_step(COMM_INT8, COMM_PROD, 0xF0, 0xF0) == 0);                     // -16 * -16 = 256
  CHECK(one_step(COMM_INT32, COMM_PROD, INT32_MIN, static_cast<uint32_t>(-1)) ==
        static_cast<uint32_t>(INT32_MIN));
  CHECK(one_step(COMM_UINT32, COMM_PROD, 65536, 65536) == 0);
  CHECK(one_step(COMM_UINT32, COMM_SUM, UINT32_MAX, 2) == 1);
  CHECK(one_step(COMM_INT64, COMM_SUM, INT64_MAX, 1) == static_cast<uint64_t>(INT64_MIN));
  CHECK(one_step(COMM_INT64, COMM_PROD, INT64_MIN, static_cast<uint64_t>(-1)) ==
        static_cast<uint64_t>(INT64_MIN));
  CHECK(one_step(COMM_UINT64, COMM_SUM, UINT64_MAX, 1) == 0);
  CHECK(one_step(COMM_UINT64, COMM_PROD, uint64_t{1} << 32, uint64_t{1} << 32) == 0);
  // Signed min/max order by value, not by bit pattern.
  CHECK(one_step(COMM_INT8, COMM_MIN, 0xFF, 1) == 0xFF);
  CHECK(one_step(COMM_INT64, COMM_MAX, static_cast<uint64_t>(-5), 3) == 3);
  CHECK(one_step(COMM_UINT8, COMM_MAX, 0xFF, 1) == 0xFF);
}

TEST_CASE("integer avg is the wrapped sum divided by the ranks, truncated toward zero",
          "[reduce]") {
  auto avg = [](comm_dtype_t d, uint64_t sum, int nranks) {
    Buf b = make(d, sum);
    comm::avg_finalize(b.data(), 1, d, nranks);
    return b.get(0);
  };
  CHECK(avg(COMM_INT32, static_cast<uint32_t>(-7), 2) == static_cast<uint32_t>(-3));
  CHECK(avg(COMM_INT32, 7, 2) == 3);
  CHECK(avg(COMM_INT64, static_cast<uint64_t>(-8), 3) == static_cast<uint64_t>(-2));
  CHECK(avg(COMM_INT8, 0x80, 3) == static_cast<uint8_t>(-42));
  CHECK(avg(COMM_INT8, 0x80, 1000) == 0);  // nranks wider than the type
  CHECK(avg(COMM_UINT8, 255, 2) == 127);
  CHECK(avg(COMM_UINT32, UINT32_MAX, 4) == UINT32_MAX / 4);
  CHECK(avg(COMM_UINT64, UINT64_MAX, 3) == UINT64_MAX / 3);

  // Three ranks through the kernels: 100 + 100 wraps to -56 in int8, then -56 + 1 = -55, / 3.
  Buf acc = make(COMM_INT8, 100);
  comm::reduce_fn(COMM_INT8, COMM_AVG)(acc.data(), acc.data(), make(COMM_INT8, 100).data(), 1);
  comm::reduce_fn(COMM_INT8, COMM_AVG)(acc.data(), acc.data(), make(COMM_INT8, 1).data(), 1);
  comm::avg_finalize(acc.data(), 1, COMM_INT8, 3);
  CHECK(acc.get(0) == static_cast<uint8_t>(-18));
}

TEST_CASE("avg over three ranks matches the per-step reference for every dtype", "[reduce]") {
  Rng rng(777);
  for (comm_dtype_t d : kDtypes) {
    INFO(comm::dtype_name(d));
    const size_t n = 200;
    const Buf r0 = random_buf(d, n, rng, gen_plain);
    const Buf r1 = random_buf(d, n, rng, gen_plain);
    const Buf r2 = random_buf(d, n, rng, gen_plain);
    Buf acc = r0;
    comm::reduce_fn(d, COMM_AVG)(acc.data(), acc.data(), r1.data(), n);
    comm::reduce_fn(d, COMM_AVG)(acc.data(), r2.data(), acc.data(), n);
    comm::avg_finalize(acc.data(), n, d, 3);
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) {
      uint64_t want;
      if (is_int(d)) {
        const i128 s = int_value(d, int_wrap(d, int_value(d, r0.get(i)) + int_value(d, r1.get(i)) +
                                                    int_value(d, r2.get(i))));
        want = int_wrap(d, s / 3);
      } else {
        const uint64_t s1 = reference(d, COMM_SUM, r0.get(i), r1.get(i));
        const uint64_t s2 = reference(d, COMM_SUM, r2.get(i), s1);
        want = d == COMM_FLOAT64 ? std::bit_cast<uint64_t>(float_value(d, s2) / 3.0)
                                 : float_bits(d, float_value(d, s2) / 3.0);
      }
      if (acc.get(i) != want && ++wrong <= 3) {
        FAIL_CHECK("element " << i << " gave " << hex(acc.get(i)) << ", want " << hex(want));
      }
    }
    CHECK(wrong == 0);
  }
  // fp16: the division happens in fp32 and is rounded once: 1/3 is 0x3555.
  Buf one = make(COMM_FLOAT16, 0x3C00);
  comm::avg_finalize(one.data(), 1, COMM_FLOAT16, 3);
  CHECK(one.get(0) == 0x3555);
}

TEST_CASE("fp16 and bf16 decode every bit pattern exactly and round-trip every non-NaN",
          "[reduce]") {
  for (uint32_t p = 0; p < 65536; ++p) {
    const uint16_t v = static_cast<uint16_t>(p);
    const double hv = decode_half_ref(v);
    const float hf = comm::half_to_float(v);
    const double bv = decode_bf16_ref(v);
    const float bfl = comm::bf16_to_float(v);
    if (std::isnan(hv)) {
      if (!std::isnan(hf) || std::signbit(hf) != ((v & 0x8000) != 0)) FAIL("half " << hex(p));
      const uint16_t back = comm::float_to_half(hf);
      // NaN stays NaN, quiet, same sign, payload kept.
      if (back != (v | 0x0200)) FAIL("half NaN " << hex(p) << " came back as " << hex(back));
    } else {
      if (static_cast<double>(hf) != hv || std::signbit(hf) != std::signbit(hv)) {
        FAIL("half " << hex(p) << " decodes to " << hf << ", want " << hv);
      }
      if (comm::float_to_half(hf) != v) FAIL("half " << hex(p) << " does not round-trip");
    }
    if (std::isnan(bv)) {
      if (!std::isnan(bfl)) FAIL("bf16 " << hex(p));
      if (comm::float_to_bf16(bfl) != (v | 0x0040)) FAIL("bf16 NaN " << hex(p));
    } else {
      if (static_cast<double>(bfl) != bv || std::signbit(bfl) != std::signbit(bv)) {
        FAIL("bf16 " << hex(p) << " decodes to " << bfl << ", want " << bv);
      }
      if (comm::float_to_bf16(bfl) != v) FAIL("bf16 " << hex(p) << " does not round-trip");
    }
  }
  SUCCEED("all 65536 patterns of both formats");
}

TEST_CASE("float to fp16/bf16 rounds to nearest even, overflows to inf, keeps NaN quiet",
          "[reduce]") {
  SECTION("halfway cases go to the even neighbour") {
    CHECK(h(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);      // between 0x3C00 and 0x3C01
    CHECK(h(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);  // between 0x3C01 and 0x3C02
    CHECK(h(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3C01);  // just above
    CHECK(h(-(1.0f + std::ldexp(1.0f, -11))) == 0xBC00);
    CHECK(bf(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
    CHECK(bf(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);
    CHECK(bf(f32(0x3F808001)) == 0x3F81);
  }
  SECTION("overflow goes to inf, the largest finite survives") {
    CHECK(h(65504.0f) == 0x7BFF);
    CHECK(h(65519.99f) == 0x7BFF);
    CHECK(h(65520.0f) == 0x7C00);  // halfway to 2^16: ties to even is inf
    CHECK(h(1e10f) == 0x7C00);
    CHECK(h(-1e10f) == 0xFC00);
    CHECK(h(INFINITY) == 0x7C00);
    CHECK(bf(std::numeric_limits<float>::max()) == 0x7F80);
    CHECK(bf(f32(0x7F7F7FFF)) == 0x7F7F);
    CHECK(bf(f32(0x7F7F8000)) == 0x7F80);
    CHECK(bf(-INFINITY) == 0xFF80);
  }
  SECTION("subnormals are rounded, not flushed") {
    CHECK(h(std::ldexp(1.0f, -24)) == 0x0001);
    CHECK(h(std::ldexp(1.0f, -25)) == 0x0000);            // halfway to 0: even
    CHECK(h(std::ldexp(1.5f, -25)) == 0x0001);            // above halfway
    CHECK(h(std::ldexp(3.0f, -25)) == 0x0002);            // 1.5 ulp: even
    CHECK(h(std::ldexp(5.0f, -25)) == 0x0002);            // 2.5 ulp: even
    CHECK(h(-std::ldexp(1.0f, -26)) == 0x8000);           // signed zero kept
    CHECK(h(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)) == 0x0400);  // rounds up to normal
    CHECK(h(std::ldexp(1023.0f, -24)) == 0x03FF);
    CHECK(bf(f32(0x00010000)) == 0x0001);
    CHECK(bf(f32(0x00008000)) == 0x0000);
    CHECK(bf(f32(0x00018000)) == 0x0002);
    CHECK(bf(f32(0x00000001)) == 0x0000);
  }
  SECTION("NaN stays a quiet NaN of the same sign") {
    CHECK(h(f32(0x7F800001)) == 0x7E00);  // signalling, payload below fp16 precision
    CHECK(h(f32(0xFFC00000)) == 0xFE00);
    CHECK(h(f32(0x7FA00000)) == 0x7F00);  // payload top bits kept
    CHECK(bf(f32(0x7F800001)) == 0x7FC0);
    CHECK(bf(f32(0xFF810000)) == 0xFFC1);
    CHECK(std::isnan(comm::half_to_float(0x7C01)));
    CHECK((std::bit_cast<uint32_t>(comm::half_to_float(0x7C01)) & 0x00400000u) != 0);
  }
  SECTION("random floats match the nearest-even oracle") {
    Rng rng(99);
    std::uniform_int_distribution<uint32_t> u;
    size_t wrong = 0;
    for (int i = 0; i < 400000; ++i) {
      uint32_t bits = u(rng);
      // Concentrate half of them where fp16 is finite (|x| < 2^17).
      if (i % 2) bits = (bits & 0x807FFFFFu) | ((100u + (bits >> 23) % 44u) << 23);
      const float f = f32(bits);
      if (std::isnan(f)) continue;
      if (h(f) != half_oracle().round(f) && ++wrong <= 3) {
        FAIL_CHECK("fp16 of " << hex(bits) << " gave " << hex(h(f)));
      }
      if (bf(f) != bf16_oracle().round(f) && ++wrong <= 3) {
        FAIL_CHECK("bf16 of " << hex(bits) << " gave " << hex(bf(f)));
      }
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("fp16/bf16 steps compute in fp32 and round once to the type", "[reduce]") {
  CHECK(one_step(COMM_FLOAT16, COMM_SUM, h(2048.0f), h(1.0f)) == h(2048.0f));
  CHECK(one_step(COMM_FLOAT16, COMM_SUM, h(2048.0f), h(3.0f)) == h(2052.0f));  // 2051: to even
  CHECK(one_step(COMM_BFLOAT16, COMM_SUM, bf(256.0f), bf(1.0f)) == bf(256.0f));
  CHECK(one_step(COMM_FLOAT16, COMM_SUM, h(65504.0f), h(65504.0f)) == 0x7C00);
  CHECK(one_step(COMM_FLOAT16, COMM_PROD, h(300.0f), h(300.0f)) == 0x7C00);
  CHECK(one_step(COMM_FLOAT16, COMM_PROD, h(std::ldexp(1.0f, -12)),
                 h(std::ldexp(1.0f, -12))) == 0x0001);  // 2^-24, a subnormal
  CHECK(one_step(COMM_FLOAT16, COMM_PROD, 0x0001, 0x3800) == 0x0000);  // 2^-25: ties to zero
  // Rounding happens at every step: adding 1 to 2048 a thousand times stays at 2048.
  Buf acc = make(COMM_FLOAT16, h(2048.0f));
  const Buf one = make(COMM_FLOAT16, h(1.0f));
  for (int i = 0; i < 1000; ++i) {
    comm::reduce_fn(COMM_FLOAT16, COMM_SUM)(acc.data(), acc.data(), one.data(), 1);
  }
  CHECK(acc.get(0) == h(2048.0f));
}

TEST_CASE("every reduction is bitwise commutative, including NaN, signed zeros and inf",
          "[reduce]") {
  Rng rng(2024);
  for (comm_dtype_t d : kDtypes) {
    for (comm_op_t op : kOps) {
      INFO(comm::dtype_name(d) << " " << comm::op_name(op));
      const size_t n = 2000;
      const Buf a = random_buf(d, n, rng, gen_wild);
      const Buf b = random_buf(d, n, rng, gen_wild);
      const Buf ab = run(d, op, a, b);
      const Buf ba = run(d, op, b, a);
      size_t wrong = 0;
      for (size_t i = 0; i < n; ++i) {
        if (ab.get(i) != ba.get(i) && ++wrong <= 3) {
          FAIL_CHECK(hex(a.get(i)) << " op " << hex(b.get(i)) << " = " << hex(ab.get(i))
                                   << " but reversed = " << hex(ba.get(i)));
        }
        // A NaN operand makes a NaN result, whatever the op.
        if (!is_int(d) && (is_nan_bits(d, a.get(i)) || is_nan_bits(d, b.get(i))) &&
            !is_nan_bits(d, ab.get(i)) && ++wrong <= 3) {
          FAIL_CHECK(hex(a.get(i)) << " op " << hex(b.get(i)) << " lost the NaN");
        }
      }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("float min/max propagate NaN and order -0 below +0", "[reduce]") {
  for (comm_dtype_t d : {COMM_FLOAT32, COMM_FLOAT64, COMM_FLOAT16, COMM_BFLOAT16}) {
    INFO(comm::dtype_name(d));
    const int w = bits_of(d);
    const uint64_t neg0 = uint64_t{1} << (w - 1);
    const uint64_t one = float_bits(d, 1.0);
    const uint64_t inf = float_bits(d, INFINITY);
    const uint64_t nan = inf | (inf >> 1 & ~inf);  // exponent all ones, top mantissa bit set
    for (int order = 0; order < 2; ++order) {
      auto step = [&](comm_op_t op, uint64_t x, uint64_t y) {
        return order ? one_step(d, op, y, x) : one_step(d, op, x, y);
      };
      CHECK(step(COMM_MIN, 0, neg0) == neg0);
      CHECK(step(COMM_MAX, 0, neg0) == 0);
      CHECK(is_nan_bits(d, step(COMM_MIN, nan, one)));
      CHECK(is_nan_bits(d, step(COMM_MAX, nan, one)));
      CHECK(is_nan_bits(d, step(COMM_MIN, nan, inf | neg0)));
      CHECK(step(COMM_MIN, inf, one) == one);
      CHECK(step(COMM_MAX, inf | neg0, one) == one);
      CHECK(step(COMM_MIN, inf | neg0, one) == (inf | neg0));
    }
  }
}

TEST_CASE("in-place reduction (out == a, out == b, out == a == b) equals out-of-place",
          "[reduce]") {
  Rng rng(31337);
  for (comm_dtype_t d : kDtypes) {
    for (comm_op_t op : kOps) {
      INFO(comm::dtype_name(d) << " " << comm::op_name(op));
      const size_t n = 1037;  // several fp16 blocks plus ragged vector tails
      const Buf a = random_buf(d, n, rng, gen_wild);
      const Buf b = random_buf(d, n, rng, gen_wild);
      const comm::ReduceFn fn = comm::reduce_fn(d, op);
      const Buf want = run(d, op, a, b);
      Buf into_a = a;
      fn(into_a.data(), into_a.data(), b.data(), n);
      CHECK(into_a.bytes == want.bytes);
      Buf into_b = b;
      fn(into_b.data(), a.data(), into_b.data(), n);
      CHECK(into_b.bytes == want.bytes);
      const Buf want_self = run(d, op, a, a);
      Buf self = a;
      fn(self.data(), self.data(), self.data(), n);
      CHECK(self.bytes == want_self.bytes);
    }
  }
}

TEST_CASE("a result does not depend on where a call starts or how a buffer is split",
          "[reduce]") {
  Rng rng(4242);
  for (comm_dtype_t d : kDtypes) {
    for (comm_op_t op : kOps) {
      INFO(comm::dtype_name(d) << " " << comm::op_name(op));
      const size_t n = 1500;
      const Buf a = random_buf(d, n, rng, gen_wild);
      const Buf b = random_buf(d, n, rng, gen_wild);
      const Buf whole = run(d, op, a, b);
      Buf pieces(d, n);
      const size_t es = comm::dtype_size(d);
      const size_t cuts[] = {1, 7, 13, 300, 9, 256, 257, 33};
      size_t at = 0;
      for (size_t k = 0; at < n; k = (k + 1) % 8) {
        const size_t m = std::min(cuts[k], n - at);
        comm::reduce_fn(d, op)(pieces.bytes.data() + at * es, a.bytes.data() + at * es,
                               b.bytes.data() + at * es, m);
        at += m;
      }
      CHECK(pieces.bytes == whole.bytes);
    }
  }
}

TEST_CASE("fp16 kernels agree bit-exactly with the scalar conversions on every pattern",
          "[reduce]") {
  // On x86 with F16C the kernels take a vector path; it must equal the portable arithmetic.
  Buf all(COMM_FLOAT16, 65536), neg0(COMM_FLOAT16, 65536);
  for (uint32_t p = 0; p < 65536; ++p) {
    all.set(p, p);
    neg0.set(p, 0x8000);
  }
  const Buf sum = run(COMM_FLOAT16, COMM_SUM, all, neg0);  // x + (-0) == x
  const Buf mx = run(COMM_FLOAT16, COMM_MAX, all, all);
  size_t wrong = 0;
  for (uint32_t p = 0; p < 65536; ++p) {
    if (is_nan_bits(COMM_FLOAT16, p)) {
      wrong += sum.get(p) != 0x7E00;  // NaN results are the one canonical quiet NaN
      wrong += mx.get(p) != 0x7E00;
    } else {
      wrong += sum.get(p) != p;
      wrong += mx.get(p) != p;
    }
  }
  CHECK(wrong == 0);

  Rng rng(5);
  const size_t n = 20000;
  const Buf a = random_buf(COMM_FLOAT16, n, rng, gen_wild);
  const Buf b = random_buf(COMM_FLOAT16, n, rng, gen_wild);
  for (comm_op_t op : kOps) {
    INFO(comm::op_name(op));
    const Buf out = run(COMM_FLOAT16, op, a, b);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const float x = comm::half_to_float(static_cast<uint16_t>(a.get(i)));
      const float y = comm::half_to_float(static_cast<uint16_t>(b.get(i)));
      float r = 0;
      switch (op) {
        case COMM_SUM: case COMM_AVG: r = x + y; break;
        case COMM_PROD: r = x * y; break;
        case COMM_MIN: r = x < y ? x : y; break;
        case COMM_MAX: r = x > y ? x : y; break;
      }
      uint64_t want = comm::float_to_half(r);
      if (std::isnan(x) || std::isnan(y) || std::isnan(r)) want = 0x7E00;
      if ((op == COMM_MIN || op == COMM_MAX) && x == y) {
        want = op == COMM_MIN ? (a.get(i) | b.get(i)) : (a.get(i) & b.get(i));
      }
      bad += out.get(i) != want;
    }
    CHECK(bad == 0);
  }

  Buf avg = a;
  comm::avg_finalize(avg.data(), n, COMM_FLOAT16, 5);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t in = static_cast<uint16_t>(a.get(i));
    if (is_nan_bits(COMM_FLOAT16, in)) continue;
    bad += avg.get(i) != comm::float_to_half(comm::half_to_float(in) / 5.0f);
  }
  CHECK(bad == 0);
}

TEST_CASE("a zero count touches nothing, even with null buffers", "[reduce]") {
  for (comm_dtype_t d : kDtypes) {
    for (comm_op_t op : kOps) comm::reduce_fn(d, op)(nullptr, nullptr, nullptr, 0);
    comm::avg_finalize(nullptr, 0, d, 4);
  }
  SUCCEED();
}

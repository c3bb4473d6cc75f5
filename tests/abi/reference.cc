#include "reference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

namespace abi {

size_t dtype_size(comm_dtype_t dtype) {
  switch (dtype) {
    case COMM_FLOAT64:
    case COMM_INT64:
    case COMM_UINT64: return 8;
    case COMM_FLOAT32:
    case COMM_INT32:
    case COMM_UINT32: return 4;
    case COMM_FLOAT16:
    case COMM_BFLOAT16: return 2;
    case COMM_INT8:
    case COMM_UINT8: return 1;
  }
  return 0;
}

const char* dtype_name(comm_dtype_t dtype) {
  static const char* const names[] = {"float32", "float64", "float16", "bfloat16", "int8",
                                      "uint8",   "int32",   "uint32",  "int64",    "uint64"};
  return static_cast<unsigned>(dtype) < 10 ? names[dtype] : "?";
}

const char* op_name(comm_op_t op) {
  static const char* const names[] = {"sum", "prod", "min", "max", "avg"};
  return static_cast<unsigned>(op) < 5 ? names[op] : "?";
}

bool is_float(comm_dtype_t dtype) {
  return dtype == COMM_FLOAT32 || dtype == COMM_FLOAT64 || dtype == COMM_FLOAT16 ||
         dtype == COMM_BFLOAT16;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (absx < 0x38800000u) {  // below 2^-14: a half subnormal (or zero)
    float a;
    std::memcpy(&a, &absx, 4);
    const auto m = static_cast<uint32_t>(std::nearbyint(a * 16777216.0f));  // units of 2^-24, RNE
    return static_cast<uint16_t>(sign | m);
  }
  const uint32_t mant = absx & 0x7fffffu;
  const uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | h);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float out;
  if (exp == 0) {
    out = std::ldexp(static_cast<float>(mant), -24);
    if (sign) out = -out;
    return out;
  }
  uint32_t x;
  if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  std::memcpy(&out, &x, 4);
  return out;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float bf16_to_float(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &x, 4);
  return out;
}

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

namespace {

bool is_signed_int(comm_dtype_t dtype) {
  return dtype == COMM_INT8 || dtype == COMM_INT32 || dtype == COMM_INT64;
}

// Integer values travel as uint64: truncated to the type's width, sign-extended for signed
// types, so that equal values of one type compare equal.
uint64_t wrap(uint64_t v, comm_dtype_t dtype) {
  const unsigned bits = static_cast<unsigned>(dtype_size(dtype) * 8);
  if (bits == 64) return v;
  const uint64_t mask = (1ull << bits) - 1;
  v &= mask;
  if (is_signed_int(dtype) && (v >> (bits - 1)) != 0) v |= ~mask;
  return v;
}

uint64_t read_int(const void* p, comm_dtype_t dtype) {
  switch (dtype) {
    case COMM_INT8: { int8_t v; std::memcpy(&v, p, 1); return static_cast<uint64_t>(static_cast<int64_t>(v)); }
    case COMM_UINT8: { uint8_t v; std::memcpy(&v, p, 1); return v; }
    case COMM_INT32: { int32_t v; std::memcpy(&v, p, 4); return static_cast<uint64_t>(static_cast<int64_t>(v)); }
    case COMM_UINT32: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    default: { uint64_t v; std::memcpy(&v, p, 8); return v; }
  }
}

void write_int(void* p, uint64_t v, comm_dtype_t dtype) {
  // Little-endian: the low bytes are the truncated value.
  std::memcpy(p, &v, dtype_size(dtype));
}

double read_float(const void* p, comm_dtype_t dtype) {
  switch (dtype) {
    case COMM_FLOAT32: { float v; std::memcpy(&v, p, 4); return v; }
    case COMM_FLOAT64: { double v; std::memcpy(&v, p, 8); return v; }
    case COMM_FLOAT16: { uint16_t v; std::memcpy(&v, p, 2); return half_to_float(v); }
    default: { uint16_t v; std::memcpy(&v, p, 2); return bf16_to_float(v); }
  }
}

void write_float(void* p, double v, comm_dtype_t dtype) {
  switch (dtype) {
    case COMM_FLOAT32: { const auto f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
    case COMM_FLOAT64: std::memcpy(p, &v, 8); break;
    case COMM_FLOAT16: { const uint16_t h = float_to_half(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    default: { const uint16_t b = float_to_bf16(static_cast<float>(v)); std::memcpy(p, &b, 2); break; }
  }
}

double epsilon(comm_dtype_t dtype) {
  switch (dtype) {
    case COMM_FLOAT32: return std::ldexp(1.0, -23);
    case COMM_FLOAT64: return std::ldexp(1.0, -52);
    case COMM_FLOAT16: return std::ldexp(1.0, -10);
    default: return std::ldexp(1.0, -7);
  }
}

uint64_t int_extreme(comm_dtype_t dtype, bool high) {
  const unsigned bits = static_cast<unsigned>(dtype_size(dtype) * 8);
  if (is_signed_int(dtype)) {
    const uint64_t max = (bits == 64) ? ~0ull >> 1 : (1ull << (bits - 1)) - 1;
    return high ? max : wrap(max + 1, dtype);
  }
  return high ? wrap(~0ull, dtype) : 0;
}

std::string hex_bytes(const void* p, size_t n) {
  std::string s;
  char b[4];
  // Little-endian: print the most significant byte first.
  for (size_t i = n; i-- > 0;) {
    std::snprintf(b, sizeof b, "%02x", static_cast<const unsigned char*>(p)[i]);
    s += b;
  }
  return s;
}

std::string describe_int(uint64_t v, comm_dtype_t dtype) {
  char b[64];
  if (is_signed_int(dtype)) {
    std::snprintf(b, sizeof b, "%lld", static_cast<long long>(v));
  } else {
    std::snprintf(b, sizeof b, "%llu", static_cast<unsigned long long>(v));
  }
  return b;
}

std::string fmt_g(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

}  // namespace

void write_input(void* dst, comm_dtype_t dtype, comm_op_t op, uint64_t seed, int rank, size_t index) {
  const uint64_t h = mix64(seed ^ mix64((static_cast<uint64_t>(rank) << 48) ^ index ^
                                        (static_cast<uint64_t>(dtype) << 40) ^
                                        (static_cast<uint64_t>(op) << 44)));
  if (is_float(dtype)) {
    double v;
    if (op == COMM_PROD) {
      v = 1.0 + static_cast<double>((h >> 8) & 1023u) / 1024.0;
      if ((h >> 20) & 1u) v *= 0.5;
      if ((h >> 21) & 1u) v = -v;
    } else {
      v = static_cast<double>(static_cast<int64_t>((h >> 8) % 20001) - 10000) / 64.0;
      // A quarter of the elements spread over 2^-8 .. 2^4 (fp16 keeps five ranks' sums finite).
      if (((h >> 40) & 3u) == 0) v = std::ldexp(v, static_cast<int>((h >> 42) % 13) - 8);
    }
    write_float(dst, v, dtype);
    return;
  }
  uint64_t v;
  if (op == COMM_PROD && (h & 3u) != 0) {
    // Mostly small factors, so products are not all zero low bits; the rest wrap.
    v = is_signed_int(dtype) ? static_cast<uint64_t>(static_cast<int64_t>((h >> 8) % 7) - 3)
                             : (h >> 8) % 4;
  } else if ((h >> 8) % 32 == 0) {
    v = int_extreme(dtype, ((h >> 16) & 1u) != 0);
  } else {
    v = mix64(h);
  }
  write_int(dst, v, dtype);
}

void fill_input(void* buf, size_t count, comm_dtype_t dtype, comm_op_t op, uint64_t seed, int rank,
                size_t first_index) {
  const size_t es = dtype_size(dtype);
  auto* p = static_cast<unsigned char*>(buf);
  for (size_t i = 0; i < count; ++i) write_input(p + i * es, dtype, op, seed, rank, first_index + i);
}

namespace {

// The expected value of one reduced element, and whether got matches it; text only on demand.
struct Expected {
  bool good = true;
  std::string got_text, expected_text;
};

Expected expect_float(const unsigned char* got_p, comm_dtype_t dtype, comm_op_t op, uint64_t seed, int nranks,
                      size_t index, bool describe) {
  unsigned char in[8];
  long double sum = 0, abs_sum = 0, prod = 1;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (int r = 0; r < nranks; ++r) {
    write_input(in, dtype, op, seed, r, index);
    const double x = read_float(in, dtype);
    sum += x;
    abs_sum += std::fabs(x);
    prod *= x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  const double eps = epsilon(dtype);
  double ref = 0, tol = 0;
  switch (op) {
    case COMM_SUM: ref = static_cast<double>(sum); tol = nranks * eps * static_cast<double>(abs_sum); break;
    case COMM_AVG:
      ref = static_cast<double>(sum / nranks);
      tol = eps * static_cast<double>(abs_sum) + eps * std::fabs(ref);
      break;
    case COMM_PROD: ref = static_cast<double>(prod); tol = nranks * eps * std::fabs(ref); break;
    case COMM_MIN: ref = lo; break;
    case COMM_MAX: ref = hi; break;
  }
  const double got = read_float(got_p, dtype);
  Expected e;
  e.good = std::isfinite(got) && std::fabs(got - ref) <= tol;
  if (describe) {
    e.got_text = fmt_g(got);
    e.expected_text = fmt_g(ref) + " (tolerance " + fmt_g(tol) + ")";
  }
  return e;
}

Expected expect_int(const unsigned char* got_p, comm_dtype_t dtype, comm_op_t op, uint64_t seed, int nranks,
                    size_t index, bool describe) {
  unsigned char in[8];
  uint64_t sum = 0, prod = 1, lo = 0, hi = 0;
  const bool sgn = is_signed_int(dtype);
  for (int r = 0; r < nranks; ++r) {
    write_input(in, dtype, op, seed, r, index);
    const uint64_t x = read_int(in, dtype);
    sum += x;  // unsigned: wraps without undefined behaviour
    prod *= x;
    const bool less = sgn ? static_cast<int64_t>(x) < static_cast<int64_t>(lo) : x < lo;
    const bool more = sgn ? static_cast<int64_t>(x) > static_cast<int64_t>(hi) : x > hi;
    if (r == 0 || less) lo = x;
    if (r == 0 || more) hi = x;
  }
  uint64_t ref = 0;
  switch (op) {
    case COMM_SUM: ref = wrap(sum, dtype); break;
    case COMM_PROD: ref = wrap(prod, dtype); break;
    case COMM_MIN: ref = lo; break;
    case COMM_MAX: ref = hi; break;
    case COMM_AVG: {
      const uint64_t s = wrap(sum, dtype);
      ref = sgn ? static_cast<uint64_t>(static_cast<int64_t>(s) / nranks) : s / static_cast<uint64_t>(nranks);
      break;
    }
  }
  const uint64_t got = read_int(got_p, dtype);
  Expected e;
  e.good = got == ref;
  if (describe) {
    e.got_text = describe_int(got, dtype);
    e.expected_text = describe_int(ref, dtype);
  }
  return e;
}

}  // namespace

CheckResult check_reduced(const void* buf, size_t count, comm_dtype_t dtype, comm_op_t op,
                          uint64_t seed, int nranks, size_t first_index) {
  CheckResult result;
  const size_t es = dtype_size(dtype);
  const auto* p = static_cast<const unsigned char*>(buf);
  const bool fp = is_float(dtype);
  for (size_t i = 0; i < count; ++i) {
    const size_t index = first_index + i;
    const unsigned char* got = p + i * es;
    const bool good = fp ? expect_float(got, dtype, op, seed, nranks, index, false).good
                         : expect_int(got, dtype, op, seed, nranks, index, false).good;
    if (good) continue;
    if (result.wrong++ == 0) {
      const Expected e = fp ? expect_float(got, dtype, op, seed, nranks, index, true)
                            : expect_int(got, dtype, op, seed, nranks, index, true);
      std::string inputs;
      unsigned char in[8];
      for (int r = 0; r < nranks; ++r) {
        write_input(in, dtype, op, seed, r, index);
        if (r) inputs += ", ";
        inputs += fp ? fmt_g(read_float(in, dtype)) : describe_int(read_int(in, dtype), dtype);
      }
      result.first = "element " + std::to_string(index) + ": got " + e.got_text + " (0x" + hex_bytes(got, es) +
                     "), expected " + e.expected_text + " from inputs [" + inputs + "]";
    }
  }
  return result;
}

CheckResult check_copied(const void* buf, size_t count, comm_dtype_t dtype, comm_op_t op,
                         uint64_t seed, int rank, size_t first_index) {
  CheckResult result;
  const size_t es = dtype_size(dtype);
  const auto* p = static_cast<const unsigned char*>(buf);
  unsigned char in[8];
  for (size_t i = 0; i < count; ++i) {
    write_input(in, dtype, op, seed, rank, first_index + i);
    if (std::memcmp(in, p + i * es, es) != 0) {
      if (result.wrong == 0) {
        result.first = "element " + std::to_string(first_index + i) + ": got 0x" + hex_bytes(p + i * es, es) +
                       ", expected 0x" + hex_bytes(in, es) + " (rank " + std::to_string(rank) + "'s input)";
      }
      ++result.wrong;
    }
  }
  return result;
}

std::string first_difference(const void* a, const void* b, size_t count, comm_dtype_t dtype) {
  const size_t es = dtype_size(dtype);
  if (count == 0 || std::memcmp(a, b, count * es) == 0) return "";
  const auto* pa = static_cast<const unsigned char*>(a);
  const auto* pb = static_cast<const unsigned char*>(b);
  size_t differing = 0, first = count;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(pa + i * es, pb + i * es, es) != 0) {
      if (first == count) first = i;
      ++differing;
    }
  }
  return std::to_string(differing) + " elements differ, first " + std::to_string(first) + ": 0x" +
         hex_bytes(pa + first * es, es) + " vs 0x" + hex_bytes(pb + first * es, es);
}

}  // namespace abi

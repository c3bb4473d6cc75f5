// Every value is a small integer chosen so that every partial result of every op is exact in
// every dtype; the expected output is then exact too and a bitwise compare is valid for floats.
#include "values.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace bench {
namespace {

const std::vector<DtypeInfo> kDtypes = {
    {"float", "float32", COMM_FLOAT32, 4, Kind::kFloat, 16777216.0},
    {"double", "float64", COMM_FLOAT64, 8, Kind::kDouble, 9007199254740992.0},
    {"half", "float16", COMM_FLOAT16, 2, Kind::kHalf, 2048.0},
    {"bfloat16", "bf16", COMM_BFLOAT16, 2, Kind::kBfloat16, 256.0},
    {"int8", "char", COMM_INT8, 1, Kind::kSigned, 0},
    {"uint8", "uchar", COMM_UINT8, 1, Kind::kUnsigned, 0},
    {"int32", "int", COMM_INT32, 4, Kind::kSigned, 0},
    {"uint32", "uint", COMM_UINT32, 4, Kind::kUnsigned, 0},
    {"int64", "long", COMM_INT64, 8, Kind::kSigned, 0},
    {"uint64", "ulong", COMM_UINT64, 8, Kind::kUnsigned, 0},
};
constexpr const char* kOpNames[] = {"sum", "prod", "min", "max", "avg"};

uint16_t float_to_half(float f) {  // round to nearest even
  uint32_t x = 0;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (abs < 0x38800000u) {                                                // below 2^-14: subnormal
    float a = 0;
    std::memcpy(&a, &abs, 4);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  uint32_t h = ((((abs >> 23) - 127 + 15) << 10) | ((abs & 0x7fffffu) >> 13));
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

uint16_t float_to_bfloat16(float f) {  // round to nearest even
  uint32_t x = 0;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// Writes `v` (an exact value) into one element of the dtype.
void store(const DtypeInfo& d, double v, uint64_t bits_if_integer, void* dst) {
  switch (d.kind) {
    case Kind::kSigned:
    case Kind::kUnsigned: std::memcpy(dst, &bits_if_integer, d.bytes); break;  // little endian: low bytes
    case Kind::kFloat: {
      float f = static_cast<float>(v);
      std::memcpy(dst, &f, 4);
      break;
    }
    case Kind::kDouble: std::memcpy(dst, &v, 8); break;
    case Kind::kHalf: {
      uint16_t h = float_to_half(static_cast<float>(v));
      std::memcpy(dst, &h, 2);
      break;
    }
    case Kind::kBfloat16: {
      uint16_t h = float_to_bfloat16(static_cast<float>(v));
      std::memcpy(dst, &h, 2);
      break;
    }
  }
}

uint64_t input_value(uint64_t seed, int rank, size_t index, uint64_t bound) {
  return 1 + ((static_cast<uint64_t>(rank) + 1) * (index % kPeriod + 1) + seed) % bound;
}

}  // namespace

const std::vector<DtypeInfo>& all_dtypes() { return kDtypes; }

const DtypeInfo* find_dtype(const char* name) {
  for (const auto& d : kDtypes)
    if (std::strcmp(name, d.name) == 0 || std::strcmp(name, d.alias) == 0) return &d;
  return nullptr;
}

const DtypeInfo& dtype_info(comm_dtype_t dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d;
  return kDtypes[0];
}

const char* op_name(comm_op_t op) {
  const auto i = static_cast<size_t>(op);
  return i < COMM_NUM_OPS ? kOpNames[i] : "?";
}

bool find_op(const char* name, comm_op_t* out) {
  for (int i = 0; i < COMM_NUM_OPS; ++i) {
    if (std::strcmp(name, kOpNames[i]) == 0) {
      *out = static_cast<comm_op_t>(i);
      return true;
    }
  }
  return false;
}

// Integers wrap, which is exact in any order, so only floating point needs a bound.
uint64_t value_bound(const DtypeInfo& d, comm_op_t op, int nranks) {
  uint64_t m = 64;
  if (d.exact_limit == 0 || op == COMM_MIN || op == COMM_MAX) return m;
  auto fits = [&](uint64_t v) {
    if (op == COMM_PROD) return std::pow(static_cast<double>(v), nranks) <= d.exact_limit;
    return static_cast<double>(v) * nranks <= d.exact_limit;
  };
  while (m > 1 && !fits(m)) --m;
  return m;
}

Period input_period(const DtypeInfo& d, uint64_t seed, int rank, uint64_t bound) {
  Period out(kPeriod * d.bytes);
  for (size_t i = 0; i < kPeriod; ++i) {
    uint64_t v = input_value(seed, rank, i, bound);
    store(d, static_cast<double>(v), v, out.data() + i * d.bytes);
  }
  return out;
}

Period reduced_period(const DtypeInfo& d, comm_op_t op, uint64_t seed, int nranks, uint64_t bound) {
  Period out(kPeriod * d.bytes);
  const unsigned bits = static_cast<unsigned>(d.bytes * 8);
  for (size_t i = 0; i < kPeriod; ++i) {
    uint64_t acc = input_value(seed, 0, i, bound);  // modular for integers, exact for floats
    double exact = static_cast<double>(acc);
    for (int r = 1; r < nranks; ++r) {
      uint64_t v = input_value(seed, r, i, bound);
      switch (op) {
        case COMM_SUM:
        case COMM_AVG: acc += v; exact += static_cast<double>(v); break;
        case COMM_PROD: acc *= v; exact *= static_cast<double>(v); break;
        case COMM_MIN: acc = std::min(acc, v); exact = static_cast<double>(acc); break;
        case COMM_MAX: acc = std::max(acc, v); exact = static_cast<double>(acc); break;
      }
    }
    if (op == COMM_AVG) {
      if (d.kind == Kind::kSigned || d.kind == Kind::kUnsigned) {
        // The wrapped sum in the type, divided by the rank count, truncated toward zero.
        uint64_t wrapped = bits == 64 ? acc : acc & ((uint64_t{1} << bits) - 1);
        if (d.kind == Kind::kSigned) {
          int64_t s = bits == 64 ? static_cast<int64_t>(wrapped)
                                 : static_cast<int64_t>(wrapped << (64 - bits)) >> (64 - bits);
          acc = static_cast<uint64_t>(s / nranks);
        } else {
          acc = wrapped / static_cast<uint64_t>(nranks);
        }
      } else if (d.kind == Kind::kDouble) {
        exact = exact / nranks;
      } else {
        exact = static_cast<double>(static_cast<float>(exact) / static_cast<float>(nranks));  // in fp32
      }
    }
    store(d, exact, acc, out.data() + i * d.bytes);
  }
  return out;
}

Period rotate(const Period& p, size_t elem, size_t start) {
  const size_t shift = (start % kPeriod) * elem;
  Period out(p.size());
  std::copy(p.begin() + static_cast<ptrdiff_t>(shift), p.end(), out.begin());
  std::copy(p.begin(), p.begin() + static_cast<ptrdiff_t>(shift), out.end() - static_cast<ptrdiff_t>(shift));
  return out;
}

void fill(unsigned char* dst, size_t count, size_t elem, const Period& p, size_t start) {
  const Period r = rotate(p, elem, start);
  const size_t bytes = count * elem;
  size_t done = std::min(bytes, r.size());
  std::memcpy(dst, r.data(), done);
  while (done < bytes) {  // doubling copies of what is already there (a whole number of periods)
    size_t n = std::min(done, bytes - done);
    std::memcpy(dst + done, dst, n);
    done += n;
  }
}

int64_t count_wrong(const unsigned char* got, size_t count, size_t elem, const Period& p, size_t start) {
  const Period r = rotate(p, elem, start);
  const size_t block = r.size();
  int64_t wrong = 0;
  for (size_t i = 0; i < count; i += kPeriod) {  // a whole period at once; elements only on a mismatch
    const size_t n = std::min(kPeriod, count - i);
    const unsigned char* g = got + i * elem;
    if (n == kPeriod && std::memcmp(g, r.data(), block) == 0) continue;
    for (size_t k = 0; k < n; ++k) wrong += std::memcmp(g + k * elem, r.data() + k * elem, elem) != 0;
  }
  return wrong;
}

}  // namespace bench

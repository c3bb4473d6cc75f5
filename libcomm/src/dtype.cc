#include "dtype.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#if defined(__clang__)
#include <cpuid.h>
#endif
#define COMM_HAVE_F16C_PATH 1
#endif

namespace comm {

// ---- fp16 / bf16 conversions -----------------------------------------------------------------
// Bit operations only, so results do not depend on compiler support for _Float16. NaN handling
// matches x86 F16C (quiet bit set, payload kept/truncated), so the fast path is bit-exact.

namespace {

inline float half_to_float_impl(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant != 0 ? 0x00400000u | (mant << 13) : 0u);
  } else if (exp != 0) {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal: mant * 2^-24 with the leading one at bit p becomes a normal fp32.
    const int p = 31 - std::countl_zero(mant);
    bits = sign | (static_cast<uint32_t>(p + 127 - 24) << 23) |
           ((mant << (23 - p)) & 0x007FFFFFu);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t float_to_half_impl(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (ax >= 0x38800000u) {                                               // normal half
    const uint32_t r = ax - ((127u - 15u) << 23);
    return static_cast<uint16_t>(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: ties to even (zero)
  // Subnormal half: round (mantissa with implicit one) * 2^(e-150) to a multiple of 2^-24.
  const uint32_t e = ax >> 23;
  const uint32_t m = (ax & 0x007FFFFFu) | 0x00800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  // Rounding up may carry into the exponent field: that is the smallest normal, encoded right.
  if (rem > halfway || (rem == halfway && (q & 1u) != 0)) ++q;
  return static_cast<uint16_t>(sign | q);
}

inline float bf16_to_float_impl(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t float_to_bf16_impl(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  // Branch-free so that bf16 kernels vectorise; the NaN select keeps NaN quiet.
  const uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x0040u;
  return static_cast<uint16_t>((x & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

}  // namespace

float half_to_float(uint16_t h) { return half_to_float_impl(h); }
uint16_t float_to_half(float f) { return float_to_half_impl(f); }
float bf16_to_float(uint16_t b) { return bf16_to_float_impl(b); }
uint16_t float_to_bf16(float f) { return float_to_bf16_impl(f); }

// ---- reduction kernels -----------------------------------------------------------------------

namespace {

// Storage type S, compute type C, and the conversions between them.
template <class T>
struct NativeCodec {
  using S = T;
  using C = T;
  static C load(S v) { return v; }
  static S store(C v) { return v; }
};
struct HalfCodec {
  using S = uint16_t;
  using C = float;
  static C load(S v) { return half_to_float_impl(v); }
  static S store(C v) { return float_to_half_impl(v); }
};
struct Bf16Codec {
  using S = uint16_t;
  using C = float;
  static C load(S v) { return bf16_to_float_impl(v); }
  static S store(C v) { return float_to_bf16_impl(v); }
};

// Every NaN result becomes the one positive quiet NaN: x86 returns the first operand's payload
// for NaN + NaN, which would make a + b differ bitwise from b + a, and ranks combine partials
// in different orders.
template <class F>
inline F canonical(F r) {
  return r != r ? std::numeric_limits<F>::quiet_NaN() : r;
}

template <class T>
inline T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}

template <class T>
inline T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  // Types narrower than int would promote to (signed) int; multiply in unsigned int instead.
  using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
  return static_cast<T>(static_cast<U>(static_cast<W>(a) * static_cast<W>(b)));
}

struct SumOp {
  template <class C>
  static C apply(C a, C b) {
    if constexpr (std::is_floating_point_v<C>) {
      return canonical(a + b);
    } else {
      return wrap_add(a, b);
    }
  }
};

struct ProdOp {
  template <class C>
  static C apply(C a, C b) {
    if constexpr (std::is_floating_point_v<C>) {
      return canonical(a * b);
    } else {
      return wrap_mul(a, b);
    }
  }
};

// Equal operands differ at most in the sign of zero: OR picks -0, AND picks +0.
template <class F>
using Bits = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;
template <class F>
inline F or_bits(F a, F b) {
  const Bits<F> r = std::bit_cast<Bits<F>>(a) | std::bit_cast<Bits<F>>(b);
  return std::bit_cast<F>(r);
}
template <class F>
inline F and_bits(F a, F b) {
  const Bits<F> r = std::bit_cast<Bits<F>>(a) & std::bit_cast<Bits<F>>(b);
  return std::bit_cast<F>(r);
}

// Floats: NaN if either is NaN; min(+0, -0) = -0 and max(+0, -0) = +0 in either order.
struct MinOp {
  template <class C>
  static C apply(C a, C b) {
    if constexpr (std::is_floating_point_v<C>) {
      const C r = a == b ? or_bits(a, b) : (a < b ? a : b);
      return (a != a || b != b) ? std::numeric_limits<C>::quiet_NaN() : r;
    } else {
      return a < b ? a : b;
    }
  }
};

struct MaxOp {
  template <class C>
  static C apply(C a, C b) {
    if constexpr (std::is_floating_point_v<C>) {
      const C r = a == b ? and_bits(a, b) : (a > b ? a : b);
      return (a != a || b != b) ? std::numeric_limits<C>::quiet_NaN() : r;
    } else {
      return a > b ? a : b;
    }
  }
};

// Separate restrict-qualified loops for each way out may alias an input, so the compiler
// vectorises all of them without runtime overlap checks (in-place is the common case).
template <class K, class Op>
inline void loop_distinct(typename K::S* __restrict o, const typename K::S* __restrict x,
                          const typename K::S* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) o[i] = K::store(Op::apply(K::load(x[i]), K::load(y[i])));
}

template <class K, class Op>
inline void loop_into_a(typename K::S* __restrict o, const typename K::S* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) o[i] = K::store(Op::apply(K::load(o[i]), K::load(y[i])));
}

template <class K, class Op>
inline void loop_into_b(typename K::S* __restrict o, const typename K::S* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i) o[i] = K::store(Op::apply(K::load(x[i]), K::load(o[i])));
}

template <class K, class Op>
inline void loop_self(typename K::S* __restrict o, size_t n) {
  for (size_t i = 0; i < n; ++i) o[i] = K::store(Op::apply(K::load(o[i]), K::load(o[i])));
}

// Every kernel gets an AVX2 clone, picked once at load time (ifunc). Large buffers are
// memory-bound either way, but the in-cache chunks of a pipelined ring are not, and the
// fp16/bf16 and min/max loops need wider integer and blend instructions than SSE2 has.
// ifunc resolvers run before ThreadSanitizer's runtime is up and crash it, so TSan
// builds take the default clone only.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define COMM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define COMM_CLONES
#endif

template <class K, class Op>
COMM_CLONES void reduce_kernel(void* out, const void* a, const void* b, size_t n) {
  using S = typename K::S;
  S* o = static_cast<S*>(out);
  const S* x = static_cast<const S*>(a);
  const S* y = static_cast<const S*>(b);
  if (o == x && o == y) {
    loop_self<K, Op>(o, n);
  } else if (o == x) {
    loop_into_a<K, Op>(o, y, n);
  } else if (o == y) {
    loop_into_b<K, Op>(o, x, n);
  } else {
    loop_distinct<K, Op>(o, x, y, n);
  }
}

#ifdef COMM_HAVE_F16C_PATH
// fp16 with F16C: convert blocks to fp32 with vcvtph2ps, apply the same scalar op (vectorised),
// round back with vcvtps2ph (nearest even). Bit-exact with the portable path: the op result is
// canonicalised before rounding, and the conversions agree on every non-NaN value.
constexpr size_t kHalfBlock = 256;

__attribute__((target("avx,f16c"))) inline void f16c_to_float(float* dst, const uint16_t* src,
                                                               size_t m) {
  size_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < m; ++i) dst[i] = half_to_float_impl(src[i]);
}

__attribute__((target("avx,f16c"))) inline void f16c_from_float(uint16_t* dst, const float* src,
                                                                size_t m) {
  size_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < m; ++i) dst[i] = float_to_half_impl(src[i]);
}

template <class Op>
__attribute__((target("avx,f16c"))) void f16c_reduce(void* out, const void* a, const void* b,
                                                     size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  alignas(32) float fa[kHalfBlock];
  alignas(32) float fb[kHalfBlock];
  for (size_t base = 0; base < n; base += kHalfBlock) {
    const size_t m = std::min(kHalfBlock, n - base);
    // Both inputs are read before out is written, so exact aliasing is harmless.
    f16c_to_float(fa, x + base, m);
    f16c_to_float(fb, y + base, m);
    for (size_t i = 0; i < m; ++i) fa[i] = Op::apply(fa[i], fb[i]);
    f16c_from_float(o + base, fa, m);
  }
}

__attribute__((target("avx,f16c"))) void f16c_divide(uint16_t* buf, size_t n, float d) {
  alignas(32) float f[kHalfBlock];
  for (size_t base = 0; base < n; base += kHalfBlock) {
    const size_t m = std::min(kHalfBlock, n - base);
    f16c_to_float(f, buf + base, m);
    for (size_t i = 0; i < m; ++i) f[i] = f[i] / d;
    f16c_from_float(buf + base, f, m);
  }
}

bool cpu_has_f16c() {
  static const bool has = [] {
    __builtin_cpu_init();
#if defined(__clang__) && __clang_major__ < 15
    // clang 14 (scripts/fuzz.sh) knows no "f16c" here: CPUID leaf 1, ECX bit 29.
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
#else
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
#endif
  }();
  return has;
}
#endif

constexpr int kKernelOps = 4;  // sum, prod, min, max; avg reduces as sum

struct KernelRow {
  ReduceFn fn[kKernelOps];
};

template <class K>
constexpr KernelRow row() {
  return {{&reduce_kernel<K, SumOp>, &reduce_kernel<K, ProdOp>, &reduce_kernel<K, MinOp>,
           &reduce_kernel<K, MaxOp>}};
}

// Indexed by comm_dtype_t, then by op (comm_op_t order, avg excluded).
constexpr KernelRow kTable[COMM_NUM_DTYPES] = {
    row<NativeCodec<float>>(),
    row<NativeCodec<double>>(),
    row<HalfCodec>(),
    row<Bf16Codec>(),
    row<NativeCodec<int8_t>>(),
    row<NativeCodec<uint8_t>>(),
    row<NativeCodec<int32_t>>(),
    row<NativeCodec<uint32_t>>(),
    row<NativeCodec<int64_t>>(),
    row<NativeCodec<uint64_t>>(),
};

#ifdef COMM_HAVE_F16C_PATH
const ReduceFn kHalfF16c[kKernelOps] = {&f16c_reduce<SumOp>, &f16c_reduce<ProdOp>,
                                        &f16c_reduce<MinOp>, &f16c_reduce<MaxOp>};
#endif

template <class T>
void divide_int(void* buf, size_t n, int nranks) {
  // Signed: C++ division truncates toward zero; done in 64 bits so nranks > INT8_MAX works.
  using W = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
  T* p = static_cast<T*>(buf);
  const W d = static_cast<W>(nranks);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(static_cast<W>(p[i]) / d);
}

template <class F>
void divide_float(void* buf, size_t n, int nranks) {
  F* p = static_cast<F*>(buf);
  const F d = static_cast<F>(nranks);
  for (size_t i = 0; i < n; ++i) p[i] = p[i] / d;
}

template <class K>
void divide_via_float(void* buf, size_t n, int nranks) {
  uint16_t* p = static_cast<uint16_t*>(buf);
  const float d = static_cast<float>(nranks);
  for (size_t i = 0; i < n; ++i) p[i] = K::store(K::load(p[i]) / d);
}

}  // namespace

ReduceFn reduce_fn(comm_dtype_t dtype, comm_op_t op) {
  if (!dtype_valid(dtype) || !op_valid(op)) return nullptr;
  const int k = op == COMM_AVG ? static_cast<int>(COMM_SUM) : static_cast<int>(op);
#ifdef COMM_HAVE_F16C_PATH
  if (dtype == COMM_FLOAT16 && cpu_has_f16c()) return kHalfF16c[k];
#endif
  return kTable[dtype].fn[k];
}

void avg_finalize(void* buf, size_t count, comm_dtype_t dtype, int nranks) {
  if (count == 0 || nranks <= 1) return;  // x / 1 == x
  switch (dtype) {
    case COMM_FLOAT32: divide_float<float>(buf, count, nranks); return;
    case COMM_FLOAT64: divide_float<double>(buf, count, nranks); return;
    case COMM_FLOAT16:
#ifdef COMM_HAVE_F16C_PATH
      if (cpu_has_f16c()) {
        f16c_divide(static_cast<uint16_t*>(buf), count, static_cast<float>(nranks));
        return;
      }
#endif
      divide_via_float<HalfCodec>(buf, count, nranks);
      return;
    case COMM_BFLOAT16: divide_via_float<Bf16Codec>(buf, count, nranks); return;
    case COMM_INT8: divide_int<int8_t>(buf, count, nranks); return;
    case COMM_UINT8: divide_int<uint8_t>(buf, count, nranks); return;
    case COMM_INT32: divide_int<int32_t>(buf, count, nranks); return;
    case COMM_UINT32: divide_int<uint32_t>(buf, count, nranks); return;
    case COMM_INT64: divide_int<int64_t>(buf, count, nranks); return;
    case COMM_UINT64: divide_int<uint64_t>(buf, count, nranks); return;
  }
}

}  // namespace comm

// Reduction kernels (libcomm/src/dtype.h) checked against references that do not share code
// with the implementation (reduce_reference.h): every dtype x op, integer wrap-around and avg,
// commutativity with NaN, signed zeros and inf, in-place calls and split buffers. The fp16/bf16
// conversions are in test_reduce_half.cc.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "dtype.h"
#include "reduce_reference.h"

using namespace reduce_test;

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

TEST_CASE("a zero count touches nothing, even with null buffers", "[reduce]") {
  for (comm_dtype_t d : kDtypes) {
    for (comm_op_t op : kOps) comm::reduce_fn(d, op)(nullptr, nullptr, nullptr, 0);
    comm::avg_finalize(nullptr, 0, d, 4);
  }
  SUCCEED();
}

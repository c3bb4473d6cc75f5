// fp16 and bf16 (libcomm/src/dtype.h): every bit pattern decoded exactly and round-tripped,
// float to fp16/bf16 rounded to nearest even against an oracle that searches the representable
// values (reduce_reference.h), steps computed in fp32 and rounded once, and the fp16 kernels'
// vector path equal to the scalar conversions on every pattern.
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

// The gradient engine against its contract: what it reduces equals a plain comm_allreduce of each
// gradient (bitwise for exact wire types, within the README's bound for fp16/bf16 on the wire),
// for random parameter lists and ready orders, split parameters, unused parameters and no_sync
// accumulation, gradient-as-bucket-view and static graph's rebuild; the wire order the same on
// every rank. Ranks are threads (engine_case.h). The layout is in test_engine_layout.cc, waits and
// overlap in test_engine_overlap.cc, the reduce hook in test_engine_hook.cc, misuse in
// test_engine_misuse.cc.
#include <cstdint>
#include <cstdlib>

#include <catch2/catch.hpp>

#include "engine_case.h"

using engine_test::Spec;
using engine_test::run_engine_case;

TEST_CASE("engine: reduced gradients equal a plain all-reduce of each gradient (random lists and orders)",
          "[engine]") {
  // Bitwise on 2 ranks, whatever algorithm runs (a + b is b + a).
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    Spec s;
    s.seed = seed;
    s.op = seed % 2 ? COMM_AVG : COMM_SUM;
    s.per_rank_order = seed % 3 == 0;
    s.mixed_dtypes = seed >= 4;
    s.threads = seed == 5 ? 3 : 1;
    INFO(s.label());
    CHECK(run_engine_case(s) == "");
  }
}

TEST_CASE("engine: bitwise on 3 and 4 ranks with one algorithm for every size", "[engine]") {
  // The same association for every element needs the same algorithm for a bucket and for each
  // gradient alone: recursive doubling runs every size.
  setenv("COMM_ALGO", "recursive_doubling", 1);
  for (int n : {3, 4}) {
    Spec s;
    s.n = n;
    s.seed = 100 + static_cast<uint64_t>(n);
    s.op = COMM_SUM;
    s.per_rank_order = n == 4;
    s.max_params = 30;
    INFO(s.label());
    CHECK(run_engine_case(s) == "");
  }
  unsetenv("COMM_ALGO");
}

TEST_CASE("engine: split parameters reduce bitwise as comm_allreduce of the whole (partitions, 2-4 ranks)", "[engine]") {
  // Partitions of 256 B-2 KiB against gradients of up to 5000 elements: most parameters are split.
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    Spec s;
    s.seed = 300 + seed;
    s.partition = seed % 2 ? 256 : 2048;
    s.per_rank_order = true;
    s.view = seed == 3;
    s.wire = seed == 4 ? COMM_BFLOAT16 : COMM_UNSET;
    s.threads = seed == 2 ? 3 : 1;
    s.check_wire_order = true;
    INFO(s.label());
    CHECK(run_engine_case(s) == "");
  }
  setenv("COMM_ALGO", "recursive_doubling", 1);  // one association for every size (as above)
  for (int n : {3, 4}) {
    Spec s;
    s.n = n;
    s.seed = 310 + static_cast<uint64_t>(n);
    s.op = COMM_SUM;
    s.partition = 1024;
    s.per_rank_order = true;
    s.max_params = 25;
    s.check_wire_order = true;
    INFO(s.label());
    CHECK(run_engine_case(s) == "");
  }
  unsetenv("COMM_ALGO");
}

TEST_CASE("engine: the wire order is the same on every rank under random per-rank ready orders", "[engine]") {
  for (int n : {3, 4})
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      Spec s;
      s.n = n;
      s.seed = 400 + seed * 10 + static_cast<uint64_t>(n);
      s.partition = 512;
      s.per_rank_order = true;
      s.threads = seed == 2 ? 2 : 1;
      s.steps = 3;
      s.find_unused = seed == 3;
      s.check_wire_order = true;
      s.jitter = true;
      s.op = COMM_MAX;  // exact whatever the association
      INFO(s.label());
      CHECK(run_engine_case(s) == "");
    }
}

TEST_CASE("engine: unused parameters are reduced as zeros and reported", "[engine]") {
  for (bool view : {false, true}) {
    Spec s;
    s.seed = 21 + view;
    s.find_unused = true;
    s.per_rank_order = true;
    s.view = view;
    s.steps = 3;
    INFO(s.label());
    CHECK(run_engine_case(s) == "");
  }
}

TEST_CASE("engine: no_sync steps accumulate locally; the next synced step reduces the sum", "[engine]") {
  for (bool view : {false, true}) {
    Spec s;
    s.seed = 31 + view;
    s.nosync_steps = 2;
    s.view = view;
    INFO(s.label());
    CHECK(run_engine_case(s) == "");
  }
}

TEST_CASE("engine: gradient-as-bucket-view and static graph (rebuilt once, views move with their values)",
          "[engine]") {
  for (int v = 0; v < 4; ++v) {
    Spec s;
    s.seed = 41 + static_cast<uint64_t>(v);
    s.view = v & 1;
    s.static_graph = true;
    s.find_unused = v & 2;
    s.per_rank_order = v == 3;
    s.steps = 3;
    INFO(s.label());
    CHECK(run_engine_case(s) == "");
  }
}

TEST_CASE("engine: fp16 and bf16 on the wire stay within the documented bound", "[engine]") {
  for (int wire : {COMM_FLOAT16, COMM_BFLOAT16})
    for (int n : {2, 3}) {
      Spec s;
      s.n = n;
      s.seed = 51 + static_cast<uint64_t>(wire) + static_cast<uint64_t>(n);
      s.wire = wire;
      s.op = n == 2 ? COMM_AVG : COMM_SUM;
      s.view = n == 3;
      s.mixed_dtypes = true;
      INFO(s.label());
      CHECK(run_engine_case(s) == "");
    }
}

// The full size: up to 500 parameters of up to 10M elements (<= 256 MiB per case).
// Minutes on this machine: run by hand, `engine_tests "[slow]"`.
TEST_CASE("engine: full-size sweep", "[engine][slow][.]") {
  for (uint64_t seed = 1000; seed < 1006; ++seed) {
    Spec s;
    s.seed = seed;
    s.max_params = 500;
    s.max_count = 10'000'000;
    s.max_total = 64u << 20;  // 256 MiB of float32
    s.cap = COMM_UNSET;
    s.first = COMM_UNSET;
    s.find_unused = seed % 2;
    s.per_rank_order = seed % 3 == 0;
    s.nosync_steps = seed % 2;
    s.steps = 2;
    INFO(s.label());
    CHECK(run_engine_case(s) == "");
  }
}

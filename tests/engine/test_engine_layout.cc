// The gradient engine's layout (libcomm/src/engine/layout.h), without ranks: buckets in reverse
// registration order under the first bucket's size and the cap, one dtype each, parameters never
// split; partitions that pack parameters whole, split large ones in equal pieces and take their
// priority from their parameters.
#include <algorithm>
#include <climits>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/layout.h"

TEST_CASE("buckets: reverse registration order, first bucket and cap, one dtype each, parameters never split",
          "[engine]") {
  using comm::engine::ParamInfo;
  std::vector<ParamInfo> params = {{100, COMM_FLOAT32}, {300, COMM_FLOAT32}, {50, COMM_FLOAT64},
                                   {1000, COMM_FLOAT32}, {10, COMM_FLOAT32}, {200, COMM_FLOAT32}};
  auto b = comm::engine::assign_buckets(params, comm::engine::reverse_order(params.size()), 2000, 900);
  // fp32 in reverse: 5 (800 B) fits the first bucket (900 B); 4 (40 B) too; 3 (4000 B) opens the next,
  // alone (bigger than the cap); 1 (1200 B) closes it; 0 joins 1. fp64: 2 alone.
  REQUIRE(b.size() == 4);
  CHECK(b[0].params == std::vector<int>{5, 4});
  CHECK(b[1].params == std::vector<int>{3});
  CHECK(b[2].dtype == COMM_FLOAT64);
  CHECK(b[2].params == std::vector<int>{2});
  CHECK(b[3].params == std::vector<int>{1, 0});
  CHECK(b[3].offset == std::vector<size_t>{0, 300});
  CHECK(b[3].count == 400);
  // Every parameter exactly once, whatever the caps.
  std::mt19937 g(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<ParamInfo> ps(1 + g() % 60);
    for (auto& p : ps) p = {g() % 5000, g() % 3 ? COMM_FLOAT32 : COMM_FLOAT16};
    std::vector<int> order(ps.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::shuffle(order.begin(), order.end(), g);
    const size_t cap = 1 + g() % 20000, first = 1 + g() % 20000;
    auto bs = comm::engine::assign_buckets(ps, order, cap, first);
    std::vector<int> seen(ps.size(), 0);
    for (auto& bk : bs) {
      size_t bytes = 0;
      for (int p : bk.params) {
        ++seen[static_cast<size_t>(p)];
        CHECK(ps[static_cast<size_t>(p)].dtype == bk.dtype);
        bytes += ps[static_cast<size_t>(p)].count * (bk.dtype == COMM_FLOAT32 ? 4 : 2);
      }
      if (bk.params.size() > 1) CHECK(bytes <= std::max(cap, first));
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
  }
}

TEST_CASE("partitions: parameters packed whole, large ones split in equal pieces, priorities from parameters", "[engine]") {
  using comm::engine::ParamInfo;
  std::vector<ParamInfo> params = {{100, COMM_FLOAT32}, {1000, COMM_FLOAT32}, {0, COMM_FLOAT32}, {30, COMM_FLOAT32}};
  auto b = comm::engine::assign_buckets(params, comm::engine::reverse_order(params.size()), 1 << 20, 1 << 20);
  REQUIRE(b.size() == 1);  // 3, 2, 1, 0 at offsets 0, 30, 30, 1030
  std::vector<int> prio = {0, 1, 2, 3};
  auto parts = comm::engine::cut_partitions(b, params, prio, 1600);  // 400 elements
  // [3 (30) + 2 (0)] then 1 (1000) in 3 pieces of 334/334/332, then 0 (100).
  REQUIRE(parts.size() == 5);
  CHECK(parts[0].params == std::vector<int>{3, 2});
  CHECK(parts[0].count == 30);
  CHECK(parts[0].priority == 2);
  for (int k = 1; k <= 3; ++k) CHECK(parts[static_cast<size_t>(k)].params == std::vector<int>{1});
  CHECK(parts[1].begin == 30);
  CHECK(parts[1].count == 334);
  CHECK(parts[3].begin + parts[3].count == 1030);
  CHECK(parts[4].params == std::vector<int>{0});
  CHECK(parts[4].priority == 0);
  // Random lists: partitions tile each bucket, within the limit unless one parameter piece, every
  // parameter in at least one.
  std::mt19937 g(11);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<ParamInfo> ps(1 + g() % 40);
    for (auto& p : ps) p = {g() % 3000, g() % 3 ? COMM_FLOAT32 : COMM_FLOAT64};
    auto bs = comm::engine::assign_buckets(ps, comm::engine::reverse_order(ps.size()), 1 + g() % 20000, 1 + g() % 20000);
    std::vector<int> pr(ps.size());
    for (size_t i = 0; i < pr.size(); ++i) pr[i] = static_cast<int>(g() % 50);
    const size_t limit = 8 + g() % 8000;
    auto pts = comm::engine::cut_partitions(bs, ps, pr, limit);
    std::vector<size_t> covered(bs.size(), 0);
    std::vector<int> seen(ps.size(), 0);
    for (const auto& pt : pts) {
      REQUIRE(!pt.params.empty());
      CHECK(pt.begin == covered[static_cast<size_t>(pt.bucket)]);  // in offset order, no gap
      covered[static_cast<size_t>(pt.bucket)] = pt.begin + pt.count;
      const size_t es = bs[static_cast<size_t>(pt.bucket)].dtype == COMM_FLOAT32 ? 4 : 8;
      CHECK(pt.count * es <= std::max(limit, es));
      int minp = INT32_MAX;
      for (int p : pt.params) {
        seen[static_cast<size_t>(p)] = 1;
        minp = std::min(minp, pr[static_cast<size_t>(p)]);
      }
      CHECK(pt.priority == minp);
    }
    for (size_t bk = 0; bk < bs.size(); ++bk) CHECK(covered[bk] == bs[bk].count);
    CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
  }
}

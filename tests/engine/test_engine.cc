// The gradient engine against its contract: what it reduces equals a plain comm_allreduce of each
// gradient (bitwise for exact wire types, within the README's bound for fp16/bf16 on the wire),
// for random parameter lists and ready orders, unused parameters and no_sync accumulation; the
// bucket layout; overlap (a bucket runs before end()); static graph's rebuild. Ranks are threads.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include <catch2/catch.hpp>

#include "abi/harness.h"
#include "engine/layout.h"
#include "support/loaded_host.h"

namespace {

using abi::Failures;

struct Spec {
  int n = 2;
  uint64_t seed = 1;
  int max_params = 40;
  size_t max_count = 5000;
  size_t max_total = SIZE_MAX;  // elements in the whole list
  comm_op_t op = COMM_AVG;
  int wire = COMM_UNSET;
  bool view = false;
  bool static_graph = false;
  bool find_unused = false;
  bool per_rank_order = false;
  bool mixed_dtypes = false;
  int nosync_steps = 0;
  int steps = 2;
  int threads = 1;  // reporting threads per rank
  int64_t cap = 64 << 10, first = 16 << 10;
  int64_t partition = COMM_UNSET;  // bytes; small ones split parameters
  bool overlap = false;            // overlap_forward: comm_engine_wait(p) before reading p
  bool check_wire_order = false;   // every rank ran the partitions in the same order
  bool jitter = false;             // random pauses between reports (ranks differ in what is ready when)

  std::string label() const {
    return "n=" + std::to_string(n) + " seed=" + std::to_string(seed) + " op=" + std::to_string(op) +
           " wire=" + std::to_string(wire) + " view=" + std::to_string(view) + " static=" + std::to_string(static_graph) +
           " unused=" + std::to_string(find_unused) + " per_rank_order=" + std::to_string(per_rank_order) +
           " nosync=" + std::to_string(nosync_steps) + " threads=" + std::to_string(threads) +
           " partition=" + std::to_string(partition) + " overlap=" + std::to_string(overlap);
  }
};

size_t esize(comm_dtype_t t) { return abi::dtype_size(t); }

// The framework's gradient of (rank, step, micro-step, param, element): deterministic, so the
// reference needs no extra traffic; floats in [-1, 1), integers small.
void add_grad(void* buf, comm_dtype_t t, size_t count, uint64_t key) {
  std::mt19937_64 g(key);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t v = g();
    switch (t) {
      case COMM_FLOAT32: static_cast<float*>(buf)[i] += static_cast<float>(static_cast<int64_t>(v >> 40) - (1 << 23)) / (1 << 23); break;
      case COMM_FLOAT64: static_cast<double*>(buf)[i] += static_cast<double>(static_cast<int64_t>(v >> 11) - (1LL << 52)) / (1LL << 52); break;
      case COMM_INT32: static_cast<int32_t*>(buf)[i] += static_cast<int32_t>(v % 2001) - 1000; break;
      default: break;
    }
  }
}

uint64_t key(uint64_t seed, int rank, int step, int micro, int p) {
  return seed * 1000003 + static_cast<uint64_t>(rank) * 7919 + static_cast<uint64_t>(step) * 104729 +
         static_cast<uint64_t>(micro) * 15485863 + static_cast<uint64_t>(p) * 2654435761u;
}

// Runs spec on its own world; "" when every check passed.
std::string run_engine_case(const Spec& s) {
  abi::Ranks world = abi::init_ranks(s.n, "engine", 20000);
  if (!world.all_ok()) return "init failed:\n" + world.describe();
  std::mt19937_64 g(s.seed);
  const int np = 1 + static_cast<int>(g() % static_cast<uint64_t>(s.max_params));
  std::vector<size_t> counts(static_cast<size_t>(np));
  std::vector<comm_dtype_t> dtypes(static_cast<size_t>(np), COMM_FLOAT32);
  size_t total = 0;
  for (int p = 0; p < np; ++p) {
    // Mostly small, a few large, some empty: buckets of one and of many parameters.
    const uint64_t r = g() % 10;
    size_t c = r == 0 ? 0 : r < 8 ? 1 + g() % 300 : 1 + g() % s.max_count;
    if (total + c > s.max_total) c = g() % 300;  // the case's budget is spent: small ones only
    counts[static_cast<size_t>(p)] = c;
    total += c;
    if (s.mixed_dtypes && g() % 4 == 0) dtypes[static_cast<size_t>(p)] = g() % 2 ? COMM_FLOAT64 : COMM_INT32;
  }
  Failures fails;
  abi::on_ranks(s.n, [&](int rank) {
    const std::string who = s.label() + " rank " + std::to_string(rank) + ": ";
    comm_t parent = world.comms[static_cast<size_t>(rank)];
    comm_engine_config_t cfg = COMM_ENGINE_CONFIG_INIT;
    cfg.bucket_cap_bytes = s.cap;
    cfg.first_bucket_bytes = s.first;
    cfg.op = s.op;
    cfg.wire_dtype = s.wire;
    cfg.gradient_as_bucket_view = s.view;
    cfg.static_graph = s.static_graph;
    cfg.find_unused_parameters = s.find_unused;
    cfg.partition_bytes = s.partition;
    cfg.overlap_forward = s.overlap;
    comm_engine_t eng = nullptr;
    auto check = [&](comm_status_t st, const char* what) {
      if (st != COMM_OK) fails.add(who + what + ": " + abi::status_name(st) + ": " + comm_last_error(nullptr));
      return st == COMM_OK;
    };
    if (!check(comm_engine_create(parent, &cfg, &eng), "create")) return;
    for (int p = 0; p < np; ++p) {
      int idx = -1;
      check(comm_engine_register(eng, counts[static_cast<size_t>(p)], dtypes[static_cast<size_t>(p)], &idx), "register");
      if (idx != p) fails.add(who + "register gave index " + std::to_string(idx) + " for parameter " + std::to_string(p));
    }
    if (!check(comm_engine_finalize(eng), "finalize")) return (void)comm_engine_destroy(eng);
    // The framework's gradient buffers (or the engine's views), and the ready order.
    std::vector<std::vector<unsigned char>> own(static_cast<size_t>(np));
    std::vector<void*> grad(static_cast<size_t>(np));
    std::mt19937_64 og(s.per_rank_order ? s.seed * 31 + static_cast<uint64_t>(rank) : s.seed * 31);
    std::vector<int> order(static_cast<size_t>(np));
    for (int p = 0; p < np; ++p) order[static_cast<size_t>(p)] = p;
    std::shuffle(order.begin(), order.end(), og);
    std::vector<uint8_t> unused(static_cast<size_t>(np), 0);
    if (s.find_unused)
      for (int p = 0; p < np; ++p) unused[static_cast<size_t>(p)] = og() % 5 == 0;
    auto locate = [&] {
      for (int p = 0; p < np; ++p) {
        const size_t bytes = counts[static_cast<size_t>(p)] * esize(dtypes[static_cast<size_t>(p)]);
        if (s.view) {
          check(comm_engine_grad_view(eng, p, &grad[static_cast<size_t>(p)]), "grad_view");
        } else {
          own[static_cast<size_t>(p)].assign(bytes, 0);
          grad[static_cast<size_t>(p)] = own[static_cast<size_t>(p)].data();
        }
      }
    };
    locate();
    int layout = 1;
    std::vector<std::vector<unsigned char>> input(static_cast<size_t>(np)), ref(static_cast<size_t>(np));
    for (int step = 0; step < s.steps && fails.count() == 0; ++step) {
      for (int p = 0; p < np; ++p)
        std::memset(grad[static_cast<size_t>(p)], 0, counts[static_cast<size_t>(p)] * esize(dtypes[static_cast<size_t>(p)]));
      for (int micro = 0; micro <= s.nosync_steps; ++micro) {
        const bool sync = micro == s.nosync_steps;
        if (!check(comm_engine_begin(eng, sync), "begin")) return (void)comm_engine_destroy(eng);
        // Report from s.threads threads at once, each taking every threads-th gradient in order.
        auto report = [&](int t) {
          std::mt19937_64 jg(s.seed * 977 + static_cast<uint64_t>(rank) * 31 + static_cast<uint64_t>(t));
          for (size_t i = static_cast<size_t>(t); i < order.size(); i += static_cast<size_t>(s.threads)) {
            const int p = order[i];
            if (unused[static_cast<size_t>(p)]) continue;
            if (s.jitter) std::this_thread::sleep_for(std::chrono::microseconds(jg() % 400));
            add_grad(grad[static_cast<size_t>(p)], dtypes[static_cast<size_t>(p)], counts[static_cast<size_t>(p)],
                     key(s.seed, rank, step, micro, p));
            if (sync) {
              const size_t bytes = counts[static_cast<size_t>(p)] * esize(dtypes[static_cast<size_t>(p)]);
              input[static_cast<size_t>(p)].assign(static_cast<unsigned char*>(grad[static_cast<size_t>(p)]),
                                                   static_cast<unsigned char*>(grad[static_cast<size_t>(p)]) + bytes);
            }
            check(comm_engine_grad_ready(eng, p, s.view && (p % 2) ? nullptr : grad[static_cast<size_t>(p)]), "grad_ready");
          }
        };
        std::vector<std::thread> ts;
        for (int t = 0; t < s.threads; ++t) ts.emplace_back(report, t);
        for (auto& t : ts) t.join();
        if (!check(comm_engine_end(eng), "end")) return (void)comm_engine_destroy(eng);
      }
      if (s.overlap) {  // each gradient waited for alone, in a random order (a forward's layers)
        std::vector<int> w(order);
        std::shuffle(w.begin(), w.end(), og);
        for (int p : w) check(comm_engine_wait(eng, p), "wait");
      }
      // The reference: each gradient alone through comm_allreduce on the trainer's communicator
      // (unused ones as zeros, as the engine reduces them).
      comm_engine_stats_t st;
      st.size = sizeof st;
      check(comm_engine_stats(eng, &st), "stats");
      for (int p = 0; p < np && fails.count() == 0; ++p) {
        const auto P = static_cast<size_t>(p);
        const comm_dtype_t t = dtypes[P];
        const size_t n = counts[P], bytes = n * esize(t);
        std::vector<unsigned char> in = unused[P] ? std::vector<unsigned char>(bytes, 0) : input[P];
        in.resize(bytes);
        ref[P].assign(bytes, 0);
        const bool compressed = s.wire != COMM_UNSET && t == COMM_FLOAT32;
        if (!compressed) {
          check(comm_allreduce(parent, in.data(), ref[P].data(), n, t, s.op, nullptr), "reference allreduce");
        }
        // The engine's result is where the framework reads it: its buffer (or the view).
        const void* got = grad[P];
        // (After a static-graph rebuild the old views still hold the result until the next begin.)
        if (unused[P] && !s.view) continue;  // no buffer was handed over for it
        if (!compressed) {
          if (n > 0 && std::memcmp(got, ref[P].data(), bytes) != 0) {
            size_t i = 0;
            while (i < bytes && static_cast<const unsigned char*>(got)[i] == ref[P][i]) ++i;
            fails.add(who + "step " + std::to_string(step) + " parameter " + std::to_string(p) + " (" +
                      abi::dtype_name(t) + ", " + std::to_string(n) + " elements) differs from comm_allreduce at byte " +
                      std::to_string(i));
          }
          continue;
        }
        // fp16/bf16 on the wire: |got - exact| <= (n+1) u S + n 2^-24, S = sum |x| (avg: / n).
        std::vector<double> x(n), sum(n), mag(n);
        for (size_t i = 0; i < n; ++i) x[i] = reinterpret_cast<const float*>(in.data())[i];
        check(comm_allreduce(parent, x.data(), sum.data(), n, COMM_FLOAT64, COMM_SUM, nullptr), "exact sum");
        for (size_t i = 0; i < n; ++i) x[i] = std::fabs(x[i]);
        check(comm_allreduce(parent, x.data(), mag.data(), n, COMM_FLOAT64, COMM_SUM, nullptr), "magnitude");
        const double u = s.wire == COMM_FLOAT16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
        const double div = s.op == COMM_AVG ? s.n : 1;
        for (size_t i = 0; i < n; ++i) {
          const double exact = sum[i] / div;
          const double bound = ((s.n + 1) * u * mag[i] + s.n * std::ldexp(1.0, -24)) / div;
          const double v = static_cast<const float*>(got)[i];
          if (!(std::fabs(v - exact) <= bound)) {
            fails.add(who + "step " + std::to_string(step) + " parameter " + std::to_string(p) + " element " +
                      std::to_string(i) + ": " + std::to_string(v) + " vs exact " + std::to_string(exact) +
                      " beyond the bound " + std::to_string(bound));
            break;
          }
        }
      }
      if (s.check_wire_order && fails.count() == 0) {
        // The sequence of partition all-reduces is a sequence of collectives: identical everywhere.
        const int nparts = st.num_partition_stats;
        std::vector<int32_t> mine(static_cast<size_t>(nparts)), all(static_cast<size_t>(nparts * s.n));
        for (int k = 0; k < nparts; ++k) mine[static_cast<size_t>(k)] = st.partitions[k].wire_order;
        check(comm_allgather(parent, mine.data(), all.data(), static_cast<size_t>(nparts), COMM_INT32, nullptr), "allgather order");
        for (int r = 0; r < s.n; ++r)
          if (!std::equal(mine.begin(), mine.end(), all.begin() + r * nparts))
            fails.add(who + "step " + std::to_string(step) + ": partitions went on the wire in a different order than on rank " +
                      std::to_string(r));
        // A round every 4 partitions' worth of bytes (libcomm/src/engine/schedule.cc).
        if (s.partition > 0 && st.bytes >= 8 * static_cast<uint64_t>(s.partition) && st.rounds == 0)
          fails.add(who + "no readiness round was held");
        // Rounds without news are not held (libcomm/src/engine/schedule.cc): ranks never spin in them.
        if (st.rounds > 2 * static_cast<uint64_t>(st.num_partitions) + 2)
          fails.add(who + std::to_string(st.rounds) + " rounds for " + std::to_string(st.num_partitions) + " partitions");
      }
      if (s.find_unused) {
        int nu = 0;
        for (int p = 0; p < np; ++p) nu += unused[static_cast<size_t>(p)];
        if (st.num_unused != nu)
          fails.add(who + "stats report " + std::to_string(st.num_unused) + " unused, expected " + std::to_string(nu));
      }
      if (st.layout_version != layout) {
        // Static graph rebuilt the buckets: views moved (their contents came along).
        if (!s.static_graph || step != 0) fails.add(who + "layout changed at step " + std::to_string(step));
        layout = st.layout_version;
        if (s.view) {
          std::vector<void*> old = grad;
          locate();
          for (int p = 0; p < np; ++p) {
            const auto P = static_cast<size_t>(p);
            const size_t bytes = counts[P] * esize(dtypes[P]);
            const bool compressed = s.wire != COMM_UNSET && dtypes[P] == COMM_FLOAT32;
            if (!compressed && bytes > 0 && std::memcmp(grad[P], ref[P].data(), bytes) != 0)
              fails.add(who + "after the rebuild, the view of parameter " + std::to_string(p) + " lost its reduced value");
          }
        }
      }
    }
    check(comm_engine_destroy(eng), "destroy");
  });
  abi::destroy_ranks(world.comms);
  return fails.summary();
}

}  // namespace

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

TEST_CASE("engine: overlap_forward: end() returns early, comm_engine_wait gives each reduced gradient", "[engine]") {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    Spec s;
    s.seed = 500 + seed;
    s.partition = 1024;
    s.overlap = true;
    s.per_rank_order = true;
    s.steps = 3;
    s.view = seed == 2;
    s.nosync_steps = seed == 3 ? 1 : 0;
    s.check_wire_order = true;
    INFO(s.label());
    CHECK(run_engine_case(s) == "");
  }
}

namespace {

// The reduce hook of the "wait(0) returns early" test: it reduces each partition on a
// communicator of its own, and holds the ones that come after all of parameter 0's until the
// test thread releases them, so "later partitions are still on the wire when wait(0) returns"
// is made so, not left to the scheduler. Its first partition also waits until the rank has
// reported every gradient: the first readiness round (after 4 partitions) then finds all of
// them ready everywhere, and parameter 0's 8 partitions (priority 0) go next, ahead of 36 others.
// An engine whose wait(0) waited for the held partitions would never see them released: the
// hold ends at its deadline with COMM_ERR_TIMEOUT, and wait(0) fails instead of hanging.
struct HoldingHook {
  static constexpr int kParam0Parts = 8;  // 4 MiB in 512 KiB partitions
  comm_t comm = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  bool reported = false, released = false;
  int param0_done = 0, held = 0;

  bool wait_for(bool HoldingHook::*flag) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(60), [&] { return this->*flag; });
  }
  void set(bool HoldingHook::*flag) {
    {
      std::lock_guard<std::mutex> lock(mu);
      this->*flag = true;
    }
    cv.notify_all();
  }

  static comm_status_t reduce(const comm_engine_hook_args_t* a, void* user) {
    auto* h = static_cast<HoldingHook*>(user);
    if (a->wire_order == 0 && !h->wait_for(&HoldingHook::reported)) return COMM_ERR_TIMEOUT;
    const bool has0 = std::find(a->params, a->params + a->num_params, 0) != a->params + a->num_params;
    bool hold = false;
    {
      std::lock_guard<std::mutex> lock(h->mu);
      hold = !has0 && h->param0_done == kParam0Parts;
      h->held += hold;
    }
    if (hold && !h->wait_for(&HoldingHook::released)) return COMM_ERR_TIMEOUT;
    const comm_status_t st = comm_allreduce(h->comm, a->buffer, a->buffer, a->count, a->dtype, COMM_AVG, nullptr);
    if (has0) {
      std::lock_guard<std::mutex> lock(h->mu);
      ++h->param0_done;
    }
    return st;
  }
};

}  // namespace

TEST_CASE("engine: comm_engine_wait for the first layer returns while later partitions are on the wire", "[engine]") {
  abi::Ranks w = abi::init_ranks(2, "engine-wait", 20000);
  REQUIRE(w.all_ok());
  constexpr int kParams = 6;
  constexpr size_t kCount = 1 << 20;  // 4 MiB each
  std::vector<HoldingHook> hooks(2);
  auto out = abi::on_ranks(2, [&](int r) -> std::string {
    HoldingHook& hook = hooks[static_cast<size_t>(r)];
    if (comm_dup(w.comms[static_cast<size_t>(r)], &hook.comm) != COMM_OK) return "dup";
    comm_engine_config_t cfg = COMM_ENGINE_CONFIG_INIT;
    cfg.partition_bytes = 512 << 10;
    cfg.overlap_forward = 1;
    comm_engine_t e = nullptr;
    if (comm_engine_create(w.comms[static_cast<size_t>(r)], &cfg, &e) != COMM_OK) return "create";
    int idx;
    for (int p = 0; p < kParams; ++p) (void)comm_engine_register(e, kCount, COMM_FLOAT32, &idx);
    if (comm_engine_set_reduce_hook(e, HoldingHook::reduce, &hook) != COMM_OK) return "set_reduce_hook";
    if (comm_engine_finalize(e) != COMM_OK) return "finalize";
    std::vector<std::vector<float>> g(kParams, std::vector<float>(kCount, 1.0f + static_cast<float>(r)));
    std::string err;
    (void)comm_engine_begin(e, 1);
    for (int p = kParams - 1; p >= 0; --p) (void)comm_engine_grad_ready(e, p, g[static_cast<size_t>(p)].data());
    hook.set(&HoldingHook::reported);
    if (comm_engine_end(e) != COMM_OK) err += std::string("end: ") + comm_last_error(nullptr) + "; ";
    // Returns once parameter 0's partitions are done, while the ones after them are held.
    if (comm_engine_wait(e, 0) != COMM_OK) err += std::string("wait(0): ") + comm_last_error(nullptr) + "; ";
    if (g[0][0] != 1.5f || g[0][kCount - 1] != 1.5f) err += "gradient 0 not reduced after wait; ";
    // comm_engine_test answers without blocking: yes for 0, no for a parameter whose partitions are held.
    int done0 = 0, pending = 0;
    if (comm_engine_test(e, 0, &done0) != COMM_OK || done0 != 1) err += "test(0) after wait(0) did not say done; ";
    for (int p = 1; p < kParams; ++p) {
      int d = 1;
      if (comm_engine_test(e, p, &d) != COMM_OK) err += "test failed; ";
      pending += d == 0;
    }
    if (pending == 0) err += "test said every gradient was done while partitions were held; ";
    hook.set(&HoldingHook::released);
    for (int p = 1; p < kParams; ++p) {
      int d = 0;
      (void)comm_engine_wait(e, p);
      if (comm_engine_test(e, p, &d) != COMM_OK || d != 1) err += "test after wait(" + std::to_string(p) + ") not done; ";
    }
    {
      std::lock_guard<std::mutex> lock(hook.mu);  // the hook did hold partitions back, so the above meant something
      if (hook.held == 0) err += "no partition ran after parameter 0's (the hook held none); ";
    }
    comm_engine_stats_t st;
    st.size = sizeof st;
    (void)comm_engine_stats(e, &st);
    if (st.num_partitions != kParams * 8) err += "expected 48 partitions, got " + std::to_string(st.num_partitions) + "; ";
    // Parameter 0 (reported last) went first among the agreed partitions: right after the
    // first round, before any partition of parameters 1-4.
    int p0_last = -1, others_first = INT32_MAX;
    for (int k = 0; k < st.num_partition_stats; ++k) {
      const auto& ps = st.partitions[k];
      if (ps.first_param == 0) p0_last = std::max(p0_last, ps.wire_order);
      else if (ps.first_param != kParams - 1) others_first = std::min(others_first, ps.wire_order);
    }
    if (!(p0_last < others_first))
      err += "parameter 0's partitions did not go before those of parameters 1-4 (last of 0: " +
             std::to_string(p0_last) + ", first of the others: " + std::to_string(others_first) + "); ";
    for (int p = 0; p < kParams; ++p)
      if (g[static_cast<size_t>(p)][kCount / 2] != 1.5f) err += "gradient " + std::to_string(p) + " not reduced; ";
    if (comm_engine_destroy(e) != COMM_OK) err += "destroy; ";
    (void)comm_destroy(hook.comm);
    return err;
  });
  abi::destroy_ranks(w.comms);
  CHECK(out[0] == "");
  CHECK(out[1] == "");
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

TEST_CASE("engine: a bucket's all-reduce runs while backward goes on, before end()", "[engine]") {
  abi::Ranks w = abi::init_ranks(2, "engine-overlap", 20000);
  REQUIRE(w.all_ok());
  const char* trace = "/tmp/comm-engine-test-trace-%r.json";
  auto out = abi::on_ranks(2, [&](int r) -> std::string {
    comm_engine_config_t cfg = COMM_ENGINE_CONFIG_INIT;
    cfg.bucket_cap_bytes = 4096;  // 1024-element gradients: one bucket each
    cfg.first_bucket_bytes = 4096;
    cfg.static_graph = 1;
    cfg.trace_file = trace;
    comm_engine_t e = nullptr;
    if (comm_engine_create(w.comms[static_cast<size_t>(r)], &cfg, &e) != COMM_OK) return "create";
    int idx;
    for (int p = 0; p < 6; ++p) (void)comm_engine_register(e, 1024, COMM_FLOAT32, &idx);
    if (comm_engine_finalize(e) != COMM_OK) return "finalize";
    std::vector<std::vector<float>> g(6, std::vector<float>(1024, 1.0f));
    std::string err;
    // Step 1 reports in registration order (the reverse of the initial layout); static graph
    // rebuilds from it, so in step 2 buckets become ready in their own order. There, "backward"
    // goes on to the next layer only once the engine says the gradient just reported is reduced
    // (comm_engine_test, bounded): an engine that held the all-reduces until end() fails here,
    // and no sleep has to be long enough for a busy host to finish a bucket meanwhile.
    for (int step = 0; step < 2; ++step) {
      const double t0 = abi::now_ms();
      (void)comm_engine_begin(e, 1);
      for (int p = 0; p < 6; ++p) {
        (void)comm_engine_grad_ready(e, p, g[static_cast<size_t>(p)].data());
        if (step == 0) continue;
        int done = 0;
        const double t_report = abi::now_ms();
        while (comm_engine_test(e, p, &done) == COMM_OK && done == 0 &&
               abi::now_ms() - t_report < 20000 + loaded_host::kSlackMs)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (done == 0)
          return "gradient " + std::to_string(p) + " was not reduced before end() was called (waited " +
                 std::to_string(abi::now_ms() - t_report) + " ms): " + comm_last_error(nullptr);
      }
      const double t_end = abi::now_ms() - t0;
      if (comm_engine_end(e) != COMM_OK) return std::string("end: ") + comm_last_error(nullptr);
      comm_engine_stats_t st;
      st.size = sizeof st;
      (void)comm_engine_stats(e, &st);
      if (st.num_buckets != 6 || st.num_bucket_stats != 6) return "expected 6 buckets, got " + std::to_string(st.num_buckets);
      if (step == 1) {
        if (st.layout_version != 2) return "static graph did not rebuild";
        for (int b = 0; b < 6; ++b) {
          if (st.buckets[b].first_param != b) err += "bucket " + std::to_string(b) + " holds " + std::to_string(st.buckets[b].first_param) + "; ";
          // All but the last bucket finished while "backward" was still running (so did the
          // last, before end(): the overlap ratio is then about 1, whatever the host's load).
          if (b < 5 && st.buckets[b].done_us / 1000 >= t_end)
            err += "bucket " + std::to_string(b) + " done at " + std::to_string(st.buckets[b].done_us / 1000) +
                   " ms, end() called at " + std::to_string(t_end) + " ms; ";
        }
        if (st.overlap_ratio < 0.5) err += "overlap ratio " + std::to_string(st.overlap_ratio) + "; ";
        if (st.bytes != 6 * 4096) err += "bytes " + std::to_string(st.bytes) + "; ";
      }
    }
    if (comm_engine_destroy(e) != COMM_OK) return "destroy";
    return err;
  });
  abi::destroy_ranks(w.comms);
  CHECK(out[0] == "");
  CHECK(out[1] == "");
  // The trace shows the buckets against the step.
  for (int r = 0; r < 2; ++r) {
    const std::string path = "/tmp/comm-engine-test-trace-" + std::to_string(r) + ".json";
    FILE* f = std::fopen(path.c_str(), "r");
    REQUIRE(f != nullptr);
    std::string text(1 << 16, '\0');
    text.resize(std::fread(text.data(), 1, text.size(), f));
    std::fclose(f);
    std::remove(path.c_str());
    CHECK(text.find("\"traceEvents\"") != std::string::npos);
    CHECK(text.find("\"name\":\"partition 5\"") != std::string::npos);
    CHECK(text.find("\"name\":\"step 2\"") != std::string::npos);
    CHECK(text.find("end() wait") != std::string::npos);
  }
}

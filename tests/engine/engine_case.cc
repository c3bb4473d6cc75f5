// run_engine_case (engine_case.h): one random case of the gradient engine against its contract,
// what it reduces equals a plain comm_allreduce of each gradient (bitwise for exact wire types,
// within the README's bound for fp16/bf16 on the wire).
#include "engine_case.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "abi/harness.h"

namespace engine_test {

namespace {

using abi::Failures;

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

}  // namespace

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

}  // namespace engine_test

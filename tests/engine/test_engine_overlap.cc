// The gradient engine's overlap: with overlap_forward, end() returns early and comm_engine_wait
// gives each reduced gradient; wait for the first layer returns while later partitions are still
// on the wire (comm_engine_test answers without blocking); a bucket's all-reduce runs while
// backward goes on, before end(), as the trace shows. Ranks are threads.
#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "abi/harness.h"
#include "engine_case.h"
#include "support/loaded_host.h"

using engine_test::Spec;
using engine_test::run_engine_case;

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

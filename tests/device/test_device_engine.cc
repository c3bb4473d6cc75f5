// The gradient engine with device gradients, without a GPU: over the fake NCCL (ranks as
// threads, one fake GPU each) each bucket is an all-reduce on the engine's own stream, ordered
// after the gradients' stream by an event and that stream after it at end(); the results are
// bitwise those of comm_allreduce on each gradient. Without NCCL the buckets are staged through
// pinned host memory; without a CUDA runtime comm_engine_create says why.
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "../abi/harness.h"
#include "fakes.h"

namespace {

using namespace abi;
using namespace devtest;

struct EngineCase {
  int ranks = 1;
  bool grad_view = false;
  bool find_unused = false;  // parameter kUnused is never reported
  bool static_graph = false;
  bool one_gpu_per_rank = true;  // false: every rank on fake GPU 0 (staged: NCCL refuses that)
  int op = COMM_UNSET;           // avg
  const char* transport = nullptr;
};

// Mixed sizes so that buckets hold several gradients, one gradient, and an empty one.
const std::vector<size_t> kCounts = {1000, 3, 0, 2500, 17, 300, 4096};
constexpr int kSteps = 3;
constexpr size_t kUnused = 1;

float value(int rank, int step, size_t p, size_t i) {
  // Not exact in binary: averaging rounds, so any difference in how it is computed shows.
  return 0.1f * static_cast<float>(rank + 1) * static_cast<float>(i % 13) + 0.37f * static_cast<float>(step) +
         static_cast<float>(p) / 3.0f;
}

// Runs kSteps synced steps (and one no_sync step) on every rank; each gradient after end() must
// equal, bit for bit, comm_allreduce of the same input on the trainer's communicator with the
// same stream. Returns "" or what went wrong.
std::string run_engine(const EngineCase& k, const std::string& what) {
  FakeDevice dev;
  Ranks ranks = init_ranks(k.ranks, what, 20000, [&](int, comm_config_t& cfg) { cfg.transport = k.transport; });
  if (!ranks.all_ok()) return ranks.describe();
  Failures failures;
  const comm_op_t op = k.op == COMM_UNSET ? COMM_AVG : static_cast<comm_op_t>(k.op);
  on_ranks(k.ranks, [&](int r) {
    if (k.one_gpu_per_rank) fake_set_device(r);
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    auto fail = [&](const std::string& m) { failures.add("rank " + std::to_string(r) + ": " + m); };
    comm_engine_config_t cfg = COMM_ENGINE_CONFIG_INIT;
    cfg.stream = kStream;
    cfg.bucket_cap_bytes = 8192;
    cfg.first_bucket_bytes = 1024;
    cfg.op = k.op;
    cfg.gradient_as_bucket_view = k.grad_view ? 1 : 0;
    cfg.find_unused_parameters = k.find_unused ? 1 : 0;
    cfg.static_graph = k.static_graph ? 1 : 0;
    comm_engine_t eng = nullptr;
    if (comm_engine_create(c, &cfg, &eng) != COMM_OK) return fail("create: " + last_error(nullptr));
    for (size_t count : kCounts) {
      int idx = -1;
      if (comm_engine_register(eng, count, COMM_FLOAT32, &idx) != COMM_OK) return fail("register: " + last_error(nullptr));
    }
    if (comm_engine_finalize(eng) != COMM_OK) return fail("finalize: " + last_error(nullptr));
    std::vector<float*> own(kCounts.size()), input(kCounts.size()), expect(kCounts.size());
    for (size_t p = 0; p < kCounts.size(); ++p) {
      own[p] = dev.alloc(kCounts[p]);
      input[p] = dev.alloc(kCounts[p]);
      expect[p] = dev.alloc(kCounts[p]);
    }
    for (int step = 0; step < kSteps; ++step) {
      std::vector<float*> grad(kCounts.size());
      for (size_t p = 0; p < kCounts.size(); ++p) {
        grad[p] = own[p];
        void* view = nullptr;
        if (k.grad_view) {
          if (comm_engine_grad_view(eng, static_cast<int>(p), &view) != COMM_OK) return fail("grad_view: " + last_error(nullptr));
          grad[p] = static_cast<float*>(view);
        }
        for (size_t i = 0; i < kCounts[p]; ++i) input[p][i] = grad[p][i] = value(r, step, p, i);
      }
      if (step == 1) {  // a no_sync step in between moves nothing
        if (comm_engine_begin(eng, 0) != COMM_OK || comm_engine_grad_ready(eng, 0, grad[0]) != COMM_OK ||
            comm_engine_end(eng) != COMM_OK)
          return fail("no_sync step: " + last_error(nullptr));
        if (std::memcmp(grad[0], input[0], kCounts[0] * sizeof(float)) != 0) fail("no_sync step changed a gradient");
      }
      if (comm_engine_begin(eng, 1) != COMM_OK) return fail("begin: " + last_error(nullptr));
      for (size_t q = kCounts.size(); q-- > 0;) {
        if (k.find_unused && q == kUnused) continue;
        if (comm_engine_grad_ready(eng, static_cast<int>(q), k.grad_view ? nullptr : grad[q]) != COMM_OK)
          return fail("grad_ready: " + last_error(nullptr));
      }
      if (comm_engine_end(eng) != COMM_OK) return fail("end: " + last_error(nullptr));
      // The reference: each gradient through comm_allreduce on the trainer's communicator.
      for (size_t p = 0; p < kCounts.size(); ++p) {
        const bool unused = k.find_unused && p == kUnused;
        if (unused) std::memset(input[p], 0, kCounts[p] * sizeof(float));
        if (comm_allreduce(c, input[p], expect[p], kCounts[p], COMM_FLOAT32, op, kStream) != COMM_OK)
          return fail("reference comm_allreduce: " + last_error(c));
        if (unused && !k.grad_view) continue;  // not reported: the framework's gradient is its own
        for (size_t i = 0; i < kCounts[p]; ++i)
          if (std::memcmp(&grad[p][i], &expect[p][i], sizeof(float)) != 0) {
            fail("step " + std::to_string(step) + " gradient " + std::to_string(p) + " element " + std::to_string(i) +
                 ": " + std::to_string(grad[p][i]) + " != comm_allreduce's " + std::to_string(expect[p][i]));
            break;
          }
      }
    }
    comm_engine_stats_t stats{};
    stats.size = sizeof stats;
    if (comm_engine_stats(eng, &stats) != COMM_OK || stats.synced_steps != kSteps)
      fail("stats: " + std::to_string(stats.synced_steps) + " synced steps");
    if (k.find_unused && (stats.num_unused != 1 || stats.unused[0] != static_cast<int>(kUnused)))
      fail("stats: the unused parameter was not reported");
    if (comm_engine_destroy(eng) != COMM_OK) fail("destroy: " + last_error(nullptr));
    for (size_t p = 0; p < kCounts.size(); ++p)
      for (float* b : {own[p], input[p], expect[p]}) dev.free_fn(b);
  });
  destroy_ranks(ranks.comms);
  return failures.summary();
}

}  // namespace

TEST_CASE("engine, device gradients over NCCL: buckets are all-reduces on the engine's stream, ordered by events both "
          "ways, bitwise equal to comm_allreduce per gradient", "[device-engine]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", FAKE_CUDART);
  EnvGuard nccl("COMM_NCCL_LIBRARY", FAKE_NCCL);
  FakeNccl fake;
  REQUIRE(fake.lib != nullptr);
  for (int n : {1, 2}) {
    for (bool view : {false, true}) {
      INFO(n << " ranks, gradient_as_bucket_view " << view);
      const int allreduces = fake.count("fake_nccl_allreduces");
      const int engine_waits = fake_waits(nullptr, kStream), producer_waits = fake_waits(kStream, nullptr);
      EngineCase k;
      k.ranks = n;
      k.grad_view = view;
      CHECK(run_engine(k, "engine-nccl") == "");
      // 7 gradients in several buckets, for 3 steps: more NCCL calls than the reference's 21.
      CHECK(fake.count("fake_nccl_allreduces") > allreduces + kSteps * static_cast<int>(kCounts.size()));
      CHECK(fake_waits(nullptr, kStream) > engine_waits);  // the engine's stream after the gradients
      CHECK(fake_waits(kStream, nullptr) >= producer_waits + n * kSteps);  // the gradients' stream after end()
    }
  }
}

TEST_CASE("engine, device gradients over NCCL: sum, find_unused_parameters and static_graph keep their meaning",
          "[device-engine]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", FAKE_CUDART);
  EnvGuard nccl("COMM_NCCL_LIBRARY", FAKE_NCCL);
  EngineCase k;
  k.ranks = 2;
  k.op = COMM_SUM;
  k.find_unused = true;
  CHECK(run_engine(k, "engine-nccl-unused") == "");
  k.grad_view = true;
  k.static_graph = true;
  CHECK(run_engine(k, "engine-nccl-static") == "");
}

TEST_CASE("engine, device gradients without NCCL: staged through pinned host memory, the host path's results",
          "[device-engine]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", FAKE_CUDART);
  EnvGuard nccl("COMM_NCCL_LIBRARY", "/nonexistent/libnccl.so.2");
  for (int n : {1, 2, 3}) {
    INFO(n << " ranks");
    EngineCase k;
    k.ranks = n;
    CHECK(run_engine(k, "engine-staged") == "");
    k.grad_view = true;
    k.find_unused = true;
    CHECK(run_engine(k, "engine-staged-view") == "");
  }
}

TEST_CASE("engine, device gradients with COMM_TRANSPORT=socket: staged, even where NCCL loads", "[device-engine]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", FAKE_CUDART);
  EnvGuard nccl("COMM_NCCL_LIBRARY", FAKE_NCCL);
  FakeNccl fake;
  const int allreduces = fake.count("fake_nccl_allreduces");
  EngineCase k;
  k.ranks = 2;
  k.transport = "socket";
  CHECK(run_engine(k, "engine-socket") == "");
  CHECK(fake.count("fake_nccl_allreduces") == allreduces);
}

TEST_CASE("engine, device gradients without a CUDA runtime: COMM_ERR_UNAVAILABLE from comm_engine_create on every "
          "rank, naming the rank, the call and why", "[device-engine]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", "/nonexistent/libcudart.so.13");
  Ranks ranks = init_ranks(2, "engine-nocuda", 20000);
  REQUIRE(ranks.all_ok());
  auto out = on_ranks(2, [&](int r) {
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    comm_engine_config_t cfg = COMM_ENGINE_CONFIG_INIT;
    cfg.stream = kStream;
    comm_engine_t eng = nullptr;
    const comm_status_t st = comm_engine_create(c, &cfg, &eng);
    return std::make_pair(st, std::string(comm_last_error(nullptr)) + (eng == nullptr ? "" : " (engine not NULL)"));
  });
  for (int r = 0; r < 2; ++r) {
    const auto& [st, msg] = out[static_cast<size_t>(r)];
    INFO(msg);
    CHECK(st == COMM_ERR_UNAVAILABLE);
    CHECK(msg.rfind("rank " + std::to_string(r) + ", comm_engine_create", 0) == 0);
    CHECK(icontains(msg, "CUDA runtime library not found"));
    CHECK(icontains(msg, "stream = NULL"));
    CHECK(!icontains(msg, "engine not NULL"));
  }
  // Host gradients on the same communicators still work.
  auto host = on_ranks(2, [&](int r) {
    comm_engine_t eng = nullptr;
    return comm_engine_create(ranks.comms[static_cast<size_t>(r)], nullptr, &eng) == COMM_OK &&
           comm_engine_destroy(eng) == COMM_OK;
  });
  for (bool ok : host) CHECK(ok);
  destroy_ranks(ranks.comms);
}

TEST_CASE("engine, device gradients with fp16/bf16 compression: COMM_ERR_UNAVAILABLE saying why", "[device-engine]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", FAKE_CUDART);
  Ranks ranks = init_ranks(1, "engine-compress", 20000);
  REQUIRE(ranks.all_ok());
  comm_engine_config_t cfg = COMM_ENGINE_CONFIG_INIT;
  cfg.stream = kStream;
  cfg.wire_dtype = COMM_BFLOAT16;
  comm_engine_t eng = nullptr;
  CHECK(comm_engine_create(ranks.comms[0], &cfg, &eng) == COMM_ERR_UNAVAILABLE);
  const std::string msg = comm_last_error(nullptr);
  INFO(msg);
  CHECK(icontains(msg, "rank 0"));
  CHECK(icontains(msg, "bfloat16"));
  CHECK(icontains(msg, "kernel"));
  destroy_ranks(ranks.comms);
}

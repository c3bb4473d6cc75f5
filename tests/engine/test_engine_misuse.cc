// Misuse of the engine gets a clear error, never a hang: local mistakes fail the call and leave
// the engine usable; steps the ranks disagree on end with an error on every rank within the
// communicator's timeout. Ranks are threads.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "abi/harness.h"
#include "support/loaded_host.h"

namespace {

struct Outcome {
  comm_status_t st = COMM_OK;
  std::string msg;
  double ms = 0;
};

Outcome call(const std::function<comm_status_t()>& f) {
  Outcome o;
  const double t0 = abi::now_ms();
  o.st = f();
  o.ms = abi::now_ms() - t0;
  if (o.st != COMM_OK) o.msg = comm_last_error(nullptr);
  return o;
}

// An engine over `counts` (float32) on each rank of world, finalized.
comm_engine_t make_engine(comm_t c, const std::vector<size_t>& counts, comm_engine_config_t cfg = COMM_ENGINE_CONFIG_INIT) {
  comm_engine_t e = nullptr;
  if (comm_engine_create(c, &cfg, &e) != COMM_OK) return nullptr;
  for (size_t n : counts) {
    int idx;
    if (comm_engine_register(e, n, COMM_FLOAT32, &idx) != COMM_OK) return nullptr;
  }
  if (comm_engine_finalize(e) != COMM_OK) return nullptr;
  return e;
}

}  // namespace

TEST_CASE("engine misuse: local mistakes fail the call with a clear error and change nothing", "[engine]") {
  abi::Ranks w = abi::init_ranks(2, "engine-misuse", 20000);
  REQUIRE(w.all_ok());
  std::vector<std::vector<Outcome>> out(2);
  std::vector<std::vector<float>> result(2);
  abi::on_ranks(2, [&](int r) {
    auto& o = out[static_cast<size_t>(r)];
    comm_engine_config_t cfg = COMM_ENGINE_CONFIG_INIT;
    cfg.op = COMM_SUM;
    comm_engine_t e = make_engine(w.comms[static_cast<size_t>(r)], {4, 4}, cfg);
    if (e == nullptr) return;
    std::vector<float> g0(4, 1.0f + static_cast<float>(r)), g1(4, 2.0f);
    int idx;
    o.push_back(call([&] { return comm_engine_register(e, 4, COMM_FLOAT32, &idx); }));  // 0: after finalize
    o.push_back(call([&] { return comm_engine_end(e); }));                                // 1: end without begin
    o.push_back(call([&] { return comm_engine_grad_ready(e, 0, g0.data()); }));           // 2: outside a step
    o.push_back(call([&] { return comm_engine_begin(e, 1); }));                           // 3: ok
    o.push_back(call([&] { return comm_engine_begin(e, 1); }));                           // 4: begin twice
    o.push_back(call([&] { return comm_engine_grad_ready(e, 2, g0.data()); }));           // 5: out of range
    o.push_back(call([&] { return comm_engine_grad_ready(e, -1, g0.data()); }));          // 6: out of range
    o.push_back(call([&] { return comm_engine_grad_ready(e, 0, g0.data()); }));           // 7: ok
    o.push_back(call([&] { return comm_engine_grad_ready(e, 0, g0.data()); }));           // 8: twice
    o.push_back(call([&] { return comm_engine_grad_ready(e, 1, nullptr); }));             // 9: NULL, no views
    void* v;
    o.push_back(call([&] { return comm_engine_grad_view(e, 0, &v); }));                   // 10: no views
    o.push_back(call([&] { return comm_engine_grad_ready(e, 1, g1.data()); }));           // 11: ok
    o.push_back(call([&] { return comm_engine_end(e); }));                                // 12: ok, still usable
    result[static_cast<size_t>(r)] = g0;
    o.push_back(call([&] { return comm_engine_wait(e, 0); }));                            // 13: ok (done)
    o.push_back(call([&] { return comm_engine_wait(e, 7); }));                            // 14: out of range
    int tested = -1;
    o.push_back(call([&] { return comm_engine_test(e, 0, &tested); }));                   // test: ok (done)
    o.push_back(call([&] { return comm_engine_test(e, 7, &tested); }));                   // test: out of range
    o.push_back(call([&] { return comm_engine_test(e, 0, nullptr); }));                   // test: NULL done
    o.push_back(call([&] { return comm_engine_begin(e, 0); }));                           // 15: no_sync, ok
    o.push_back(call([&] { return comm_engine_grad_ready(e, 1, nullptr); }));             // 16: NULL in no_sync too
    o.push_back(call([&] { return comm_engine_set_priority(e, 0, 3); }));                 // 17: after finalize
    o.push_back(call([&] { return comm_engine_grad_ready(e, 1, g1.data()); }));           // 18: ok
    o.push_back(call([&] { return comm_engine_end(e); }));                                // 19: ok
    o.push_back(call([&] { return comm_engine_destroy(e); }));                            // 20
  });
  abi::destroy_ranks(w.comms);
  const comm_status_t expect[] = {COMM_ERR_INVALID_USAGE,    COMM_ERR_INVALID_USAGE,    COMM_ERR_INVALID_USAGE,
                                  COMM_OK,                   COMM_ERR_INVALID_USAGE,    COMM_ERR_INVALID_ARGUMENT,
                                  COMM_ERR_INVALID_ARGUMENT, COMM_OK,                   COMM_ERR_INVALID_USAGE,
                                  COMM_ERR_INVALID_ARGUMENT, COMM_ERR_INVALID_USAGE,    COMM_OK,
                                  COMM_OK,                   COMM_OK,                   COMM_ERR_INVALID_ARGUMENT,
                                  COMM_OK,                   COMM_ERR_INVALID_ARGUMENT, COMM_ERR_INVALID_ARGUMENT,
                                  COMM_OK,                   COMM_ERR_INVALID_ARGUMENT, COMM_ERR_INVALID_USAGE,
                                  COMM_OK,                   COMM_OK,                   COMM_OK};
  const char* words[] = {"finalize", "begin", "outside a step", "", "already open", "out of range", "out of range",
                         "", "twice", "NULL", "gradient_as_bucket_view", "", "", "", "out of range", "", "out of range", "NULL", "", "NULL",
                         "finalize", "", "", ""};
  constexpr size_t kCalls = sizeof expect / sizeof expect[0];
  for (int r = 0; r < 2; ++r) {
    REQUIRE(out[static_cast<size_t>(r)].size() == kCalls);
    for (size_t i = 0; i < kCalls; ++i) {
      const Outcome& o = out[static_cast<size_t>(r)][i];
      INFO("rank " << r << " call " << i << ": " << abi::status_name(o.st) << " " << o.msg);
      CHECK(o.st == expect[i]);
      CHECK(abi::icontains(o.msg, words[i]));
      if (o.st != COMM_OK) CHECK(abi::icontains(o.msg, "rank " + std::to_string(r)));
    }
    // The step after all those errors still reduced: 1 + 2 (sum over the ranks of 1 + rank).
    CHECK(result[static_cast<size_t>(r)] == std::vector<float>(4, 3.0f));
  }
}

TEST_CASE("engine misuse: bad config, and device streams without a CUDA runtime, are refused at create", "[engine]") {
  abi::Ranks w = abi::init_ranks(1, "engine-config", 20000);
  REQUIRE(w.all_ok());
  comm_engine_t e = nullptr;
  comm_engine_config_t cfg = COMM_ENGINE_CONFIG_INIT;
  int fake_stream;
  cfg.stream = &fake_stream;
  {
    // Device gradients over a (fake) GPU are tests/device's; without CUDA create says why.
    const char* old = std::getenv("COMM_CUDA_LIBRARY");
    const std::string saved = old ? old : "";
    ::setenv("COMM_CUDA_LIBRARY", "/nonexistent/libcudart.so.13", 1);
    CHECK(comm_engine_create(w.comms[0], &cfg, &e) == COMM_ERR_UNAVAILABLE);
    const std::string msg = comm_last_error(nullptr);
    INFO(msg);
    CHECK((abi::icontains(msg, "CUDA runtime library not found") ||
           abi::icontains(msg, "built without the CUDA/NCCL headers")));
    CHECK(abi::icontains(msg, "rank 0, comm_engine_create"));
    if (old)
      ::setenv("COMM_CUDA_LIBRARY", saved.c_str(), 1);
    else
      ::unsetenv("COMM_CUDA_LIBRARY");
  }
  cfg = COMM_ENGINE_CONFIG_INIT;
  cfg.wire_dtype = COMM_INT8;
  CHECK(comm_engine_create(w.comms[0], &cfg, &e) == COMM_ERR_INVALID_ARGUMENT);
  cfg = COMM_ENGINE_CONFIG_INIT;
  cfg.bucket_cap_bytes = 0;
  CHECK(comm_engine_create(w.comms[0], &cfg, &e) == COMM_ERR_INVALID_ARGUMENT);
  cfg = COMM_ENGINE_CONFIG_INIT;
  cfg.size = 0;
  CHECK(comm_engine_create(w.comms[0], &cfg, &e) == COMM_ERR_INVALID_ARGUMENT);
  CHECK(e == nullptr);
  // An older caller's smaller struct (up to the op) works.
  cfg = COMM_ENGINE_CONFIG_INIT;
  cfg.size = offsetof(comm_engine_config_t, wire_dtype);
  REQUIRE(comm_engine_create(w.comms[0], &cfg, &e) == COMM_OK);
  CHECK(comm_engine_destroy(e) == COMM_OK);
  abi::destroy_ranks(w.comms);
}

TEST_CASE("engine misuse: ranks that register different lists fail finalize on every rank, naming it",
          "[engine]") {
  abi::Ranks w = abi::init_ranks(3, "engine-mismatch", 20000);
  REQUIRE(w.all_ok());
  for (int variant = 0; variant < 3; ++variant) {
    auto out = abi::on_ranks(3, [&](int r) {
      comm_engine_t e = nullptr;
      comm_engine_config_t cfg = COMM_ENGINE_CONFIG_INIT;
      if (variant == 2 && r == 1) cfg.bucket_cap_bytes = 1 << 20;
      if (comm_engine_create(w.comms[static_cast<size_t>(r)], &cfg, &e) != COMM_OK) return Outcome{COMM_ERR_INTERNAL, "create", 0};
      int idx;
      (void)comm_engine_register(e, 10, COMM_FLOAT32, &idx);
      (void)comm_engine_register(e, variant == 0 && r == 2 ? 11 : 20, COMM_FLOAT32, &idx);
      if (!(variant == 1 && r == 1)) (void)comm_engine_register(e, 5, COMM_FLOAT64, &idx);
      Outcome o = call([&] { return comm_engine_finalize(e); });
      (void)comm_engine_destroy(e);
      return o;
    });
    for (int r = 0; r < 3; ++r) {
      const Outcome& o = out[static_cast<size_t>(r)];
      INFO("variant " << variant << " rank " << r << ": " << o.msg);
      CHECK(o.st == COMM_ERR_INVALID_USAGE);
      if (variant == 0) CHECK(abi::icontains(o.msg, "parameter 1 is (count 11, float32) on rank 2"));
      if (variant == 1) CHECK(abi::icontains(o.msg, "rank 1 has number of parameters = 2"));
      if (variant == 2) CHECK(abi::icontains(o.msg, "rank 1 has bucket_cap_bytes"));
    }
  }
  abi::destroy_ranks(w.comms);
}

TEST_CASE("engine misuse: a gradient missing on one rank, or a step synced on one rank only, ends with an error "
          "on every rank within the timeout",
          "[engine][deadline]") {
  constexpr int kTimeoutMs = 3000;
  for (int variant = 0; variant < 2; ++variant) {
    abi::Ranks w = abi::init_ranks(2, "engine-disagree", kTimeoutMs);
    REQUIRE(w.all_ok());
    std::atomic<bool> rank0_ended{false};
    auto out = abi::on_ranks(2, [&](int r) {
      comm_engine_config_t cfg = COMM_ENGINE_CONFIG_INIT;
      cfg.bucket_cap_bytes = 64;  // one bucket per gradient
      cfg.first_bucket_bytes = 64;
      comm_engine_t e = make_engine(w.comms[static_cast<size_t>(r)], {16, 16, 16}, cfg);
      if (e == nullptr) return Outcome{COMM_ERR_INTERNAL, "setup", 0};
      std::vector<float> g(16, 1.0f);
      // variant 0: rank 1 never reports gradient 0 (backward order: 2, 1, 0).
      // variant 1: rank 1 runs the step as no_sync.
      (void)comm_engine_begin(e, variant == 1 && r == 1 ? 0 : 1);
      for (int p = 2; p >= 0; --p)
        if (!(variant == 0 && r == 1 && p == 0)) (void)comm_engine_grad_ready(e, p, g.data());
      Outcome o = call([&] { return comm_engine_end(e); });
      if (r == 0) rank0_ended = true;
      if (variant == 1 && r == 1) {
        // The no_sync rank's step ended at once, and it goes on computing: the synced rank's
        // buckets find no partner and time out. It stays until rank 0's end() has returned (its
        // destroy would otherwise end that wait as a peer's exit, not a timeout): sleeping for
        // the timeout and a little was a race a busy host could lose. Bounded, so a hang fails.
        const double t0 = abi::now_ms();
        while (!rank0_ended && abi::now_ms() - t0 < kTimeoutMs + loaded_host::kSlackMs)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      (void)comm_engine_destroy(e);
      return o;
    });
    abi::destroy_ranks(w.comms);
    for (int r = 0; r < 2 - variant; ++r) {
      const Outcome& o = out[static_cast<size_t>(r)];
      INFO("variant " << variant << " rank " << r << ": " << abi::status_name(o.st) << " after " << o.ms << " ms: " << o.msg);
      CHECK(o.st != COMM_OK);
      CHECK(o.ms < kTimeoutMs + loaded_host::kSlackMs);  // the timeout at the latest, not a hang
    }
    if (variant == 0) {
      CHECK(out[1].st == COMM_ERR_INVALID_USAGE);
      CHECK(abi::icontains(out[1].msg, "never reported (the first: index 0)"));
    } else {
      CHECK(out[0].st == COMM_ERR_TIMEOUT);
      CHECK(abi::icontains(out[0].msg, "sync flag"));
      CHECK(out[1].st == COMM_OK);
    }
  }
}

TEST_CASE("engine misuse: comm_abort on the trainer's communicator ends a waiting end()", "[engine][deadline]") {
  abi::Ranks w = abi::init_ranks(2, "engine-abort", 20000);
  REQUIRE(w.all_ok());
  std::atomic<bool> rank0_ended{false};
  auto out = abi::on_ranks(2, [&](int r) {
    comm_engine_t e = make_engine(w.comms[static_cast<size_t>(r)], {16});
    if (e == nullptr) return Outcome{COMM_ERR_INTERNAL, "setup", 0};
    std::vector<float> g(16, 1.0f);
    Outcome o;
    if (r == 0) {
      // Rank 1 never joins the step: rank 0's end() waits until its trainer aborts.
      std::thread aborter([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        comm_abort(w.comms[0]);
      });
      (void)comm_engine_begin(e, 1);
      (void)comm_engine_grad_ready(e, 0, g.data());
      o = call([&] { return comm_engine_end(e); });
      rank0_ended = true;
      aborter.join();
    } else {
      // Stays (its engine's destroy would end rank 0's wait as a peer's exit) until rank 0's
      // end() has returned, however late a busy host runs the aborter; bounded, so a hang fails.
      const double t0 = abi::now_ms();
      while (!rank0_ended && abi::now_ms() - t0 < 20000 + loaded_host::kSlackMs)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    (void)comm_engine_destroy(e);
    return o;
  });
  abi::destroy_ranks(w.comms);
  INFO(abi::status_name(out[0].st) << " after " << out[0].ms << " ms: " << out[0].msg);
  CHECK(out[0].st == COMM_ERR_ABORTED);
  CHECK(out[0].ms < 20000);  // ended by the abort, not the communicator's 20 s timeout
  CHECK(abi::icontains(out[0].msg, "comm_abort"));
}

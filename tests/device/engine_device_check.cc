// engine-device-check: the gradient engine with device gradients on a real GPU (tools/gpu-check
// step 3), one process per rank under a launcher (comm-run -n N -- engine-device-check).
// Managed buffers (the host fills and checks them between steps) and one stream: for each
// variant (copies or gradient-as-bucket-view, with and without an unused parameter) a few synced
// steps, each gradient after end() compared bit for bit with comm_allreduce of the same input
// on the same stream. end() must not block on the GPU: the check waits on the stream itself.
// Prints one PASS/FAIL line per variant (rank 0) and exits non-zero on any failure.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/device_stream.h"
#include "comm/comm.h"

namespace {

// A small and a large bucket's worth, a gradient larger than the cap (a bucket of its own) and
// an empty one. 4 MiB cap: several buckets.
const std::vector<size_t> kCounts = {1000, 3, 0, 250000, 17, 3000, 1500000, 64};
constexpr size_t kUnused = 1;
constexpr int kSteps = 4;

float value(int rank, int step, size_t p, size_t i) {
  return 0.1f * static_cast<float>(rank + 1) * static_cast<float>(i % 13) + 0.37f * static_cast<float>(step) +
         static_cast<float>(p) / 3.0f;
}

std::string run(comm_t comm, bench::DeviceStream& dev, bool view, bool unused) {
  int rank = 0;
  (void)comm_rank(comm, &rank);
  auto err = [](const char* what) { return std::string(what) + ": " + comm_last_error(nullptr); };
  comm_engine_config_t cfg = COMM_ENGINE_CONFIG_INIT;
  cfg.stream = dev.stream();
  cfg.bucket_cap_bytes = 4 << 20;
  cfg.gradient_as_bucket_view = view ? 1 : 0;
  cfg.find_unused_parameters = unused ? 1 : 0;
  comm_engine_t eng = nullptr;
  if (comm_engine_create(comm, &cfg, &eng) != COMM_OK) return err("comm_engine_create");
  for (size_t n : kCounts) {
    int idx = 0;
    if (comm_engine_register(eng, n, COMM_FLOAT32, &idx) != COMM_OK) return err("comm_engine_register");
  }
  if (comm_engine_finalize(eng) != COMM_OK) return err("comm_engine_finalize");
  std::string e, failure;
  std::vector<float*> own, input, expect;
  for (size_t n : kCounts) {
    own.push_back(static_cast<float*>(dev.alloc(n * sizeof(float), &e)));
    input.push_back(static_cast<float*>(dev.alloc(n * sizeof(float), &e)));
    expect.push_back(static_cast<float*>(dev.alloc(n * sizeof(float), &e)));
  }
  if (!e.empty()) return e;
  for (int step = 0; step < kSteps && failure.empty(); ++step) {
    std::vector<float*> grad = own;
    for (size_t p = 0; p < kCounts.size(); ++p) {
      void* v = nullptr;
      if (view && comm_engine_grad_view(eng, static_cast<int>(p), &v) != COMM_OK) return err("comm_engine_grad_view");
      if (view) grad[p] = static_cast<float*>(v);
    }
    // Managed input, copied to the gradient (own or view) on the stream: the engine's stream
    // must wait for these copies (the event recorded at grad_ready).
    for (size_t p = 0; p < kCounts.size(); ++p)
      for (size_t i = 0; i < kCounts[p]; ++i) input[p][i] = value(rank, step, p, i);
    if (comm_engine_begin(eng, 1) != COMM_OK) return err("comm_engine_begin");
    for (size_t q = kCounts.size(); q-- > 0;) {
      if (unused && q == kUnused) continue;
      if (!dev.copy(grad[q], input[q], kCounts[q] * sizeof(float), &e)) return e;
      if (comm_engine_grad_ready(eng, static_cast<int>(q), view ? nullptr : grad[q]) != COMM_OK)
        return err("comm_engine_grad_ready");
    }
    if (comm_engine_end(eng) != COMM_OK) return err("comm_engine_end");
    for (size_t p = 0; p < kCounts.size(); ++p) {
      const bool skipped = unused && p == kUnused;
      if (skipped) {
        if (!dev.sync(&e)) return e;
        std::memset(input[p], 0, kCounts[p] * sizeof(float));
      }
      if (comm_allreduce(comm, input[p], expect[p], kCounts[p], COMM_FLOAT32, COMM_AVG, dev.stream()) != COMM_OK)
        return err("reference comm_allreduce");
    }
    if (!dev.sync(&e)) return e;
    for (size_t p = 0; p < kCounts.size() && failure.empty(); ++p) {
      if (unused && p == kUnused && !view) continue;  // not reported: the framework's own
      std::vector<float> got(kCounts[p]);
      if (!dev.copy(got.data(), grad[p], kCounts[p] * sizeof(float), &e) || !dev.sync(&e)) return e;
      for (size_t i = 0; i < kCounts[p]; ++i)
        if (std::memcmp(&got[i], &expect[p][i], sizeof(float)) != 0) {
          failure = "step " + std::to_string(step) + " gradient " + std::to_string(p) + " element " + std::to_string(i) +
                    ": " + std::to_string(got[i]) + " != comm_allreduce's " + std::to_string(expect[p][i]);
          break;
        }
    }
  }
  comm_engine_stats_t stats{};
  stats.size = sizeof stats;
  (void)comm_engine_stats(eng, &stats);
  if (comm_engine_destroy(eng) != COMM_OK && failure.empty()) failure = err("comm_engine_destroy");
  for (auto* list : {&own, &input, &expect})
    for (float* b : *list) dev.release(b);
  if (failure.empty() && static_cast<int>(stats.synced_steps) != kSteps)
    failure = std::to_string(stats.synced_steps) + " synced steps";
  if (failure.empty())
    std::printf("  rank %d: %d steps, %d buckets, %.0f us per step\n", rank, kSteps, stats.num_buckets, stats.step_us);
  return failure;
}

}  // namespace

int main() {
  bench::DeviceStream dev;
  if (std::string why = dev.open(); !why.empty()) {
    std::fprintf(stderr, "engine-device-check: %s\n", why.c_str());
    return 2;
  }
  comm_config_t cfg = COMM_CONFIG_INIT;
  comm_t comm = nullptr;
  if (comm_init(&cfg, &comm) != COMM_OK) {
    std::fprintf(stderr, "engine-device-check: comm_init: %s\n", comm_last_error(nullptr));
    return 2;
  }
  int rank = 0, size = 1, failed = 0;
  (void)comm_rank(comm, &rank);
  (void)comm_size(comm, &size);
  for (bool view : {false, true})
    for (bool unused : {false, true}) {
      const std::string failure = run(comm, dev, view, unused);
      const std::string name = std::string("engine, device gradients, ") + std::to_string(size) + " rank(s), " +
                               (view ? "gradient_as_bucket_view" : "copies") + (unused ? ", an unused parameter" : "");
      if (!failure.empty()) {
        ++failed;
        std::printf("FAIL %s: rank %d: %s\n", name.c_str(), rank, failure.c_str());
      } else if (rank == 0) {
        std::printf("PASS %s\n", name.c_str());
      }
      std::fflush(stdout);
      if (!failure.empty()) break;
    }
  (void)comm_destroy(comm);
  return failed == 0 ? 0 : 1;
}

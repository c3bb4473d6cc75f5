// engine-bench: the gradient engine on a realistic layer list with a synthetic backward.
// Run it under a launcher (comm-run -n 4 -- engine-bench). Each iteration runs, alternating
// and with a barrier between them:
//   compute  the backward alone (per-layer compute, no communication),
//   comm     the engine alone (every gradient ready at once, then end()),
//   step     both: each layer's compute, then grad_ready for its gradients; end() at the end.
// It prints the medians, step / max(compute, comm) (1.0 = perfect overlap), the exposed
// communication (time end() blocked) and the overlap ratio from comm_engine_stats.
#include <getopt.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace {

struct Options {
  int layers = 10;         // transformer blocks
  int d_model = 768;
  int vocab = 32000;       // 10 x 768 + 32000 vocab: ~95M parameters (a GPT-2-small-like list)
  double compute_ms = -1;  // backward time; < 0: the measured comm-only time (similar size)
  bool spin = false;       // compute burns a core (CPU training) instead of waiting (an accelerator)
  int iters = 10;
  int warmup = 3;
  int64_t bucket_cap_mb = -1;
  int wire = COMM_UNSET;
  bool grad_view = false;
};

struct Tensor {
  size_t count;
  int layer;  // backward reaches layers from the last to the first
};

// Definition order, as a framework registers them.
std::vector<Tensor> layer_list(const Options& o, int* num_layers) {
  const size_t d = static_cast<size_t>(o.d_model);
  std::vector<Tensor> t;
  int layer = 0;
  t.push_back({static_cast<size_t>(o.vocab) * d, layer++});  // token embedding
  for (int l = 0; l < o.layers; ++l, ++layer) {
    for (size_t n : {d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d}) t.push_back({n, layer});
  }
  t.push_back({d, layer});  // final norm
  t.push_back({d, layer});
  *num_layers = layer + 1;
  return t;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void compute_for(double ms, bool spin) {
  if (ms <= 0) return;
  const double until = now_ms() + ms;
  if (spin) {
    volatile double x = 1;
    while (now_ms() < until) x = x * 1.0000001;
    return;
  }
  timespec ts;
  ts.tv_sec = static_cast<time_t>(ms / 1000);
  ts.tv_nsec = static_cast<long>((ms - static_cast<double>(ts.tv_sec) * 1000) * 1e6);
  clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, nullptr);
}

bool ok(comm_status_t s, const char* what) {
  if (s == COMM_OK) return true;
  std::fprintf(stderr, "engine-bench: %s: %s: %s\n", what, comm_status_string(s), comm_last_error(nullptr));
  std::exit(1);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void usage() {
  std::printf(
      "usage: comm-run -n N -- engine-bench [options]\n"
      "  --layers L          transformer blocks (default 10)\n"
      "  --d-model D         width (default 768)\n"
      "  --vocab V           embedding rows (default 32000): 10 x 768 + 32000 is ~95M parameters\n"
      "  --compute-ms MS     backward compute per step (default: the measured comm-only time)\n"
      "  --spin              compute burns a core (CPU training); default: waits (an accelerator)\n"
      "  --iters N           timed iterations (default 10), --warmup N (default 3)\n"
      "  --bucket-cap-mb MB  engine bucket cap (default: the engine's, 25)\n"
      "  --wire fp16|bf16    compress float32 gradients on the wire\n"
      "  --view              gradient-as-bucket-view\n");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  static const option longopts[] = {{"layers", required_argument, nullptr, 'l'},
                                    {"d-model", required_argument, nullptr, 'd'},
                                    {"vocab", required_argument, nullptr, 'v'},
                                    {"compute-ms", required_argument, nullptr, 'c'},
                                    {"spin", no_argument, nullptr, 's'},
                                    {"iters", required_argument, nullptr, 'i'},
                                    {"warmup", required_argument, nullptr, 'w'},
                                    {"bucket-cap-mb", required_argument, nullptr, 'b'},
                                    {"wire", required_argument, nullptr, 'x'},
                                    {"view", no_argument, nullptr, 'g'},
                                    {"help", no_argument, nullptr, 'h'},
                                    {nullptr, 0, nullptr, 0}};
  for (int c; (c = getopt_long(argc, argv, "h", longopts, nullptr)) != -1;) {
    switch (c) {
      case 'l': o.layers = std::atoi(optarg); break;
      case 'd': o.d_model = std::atoi(optarg); break;
      case 'v': o.vocab = std::atoi(optarg); break;
      case 'c': o.compute_ms = std::atof(optarg); break;
      case 's': o.spin = true; break;
      case 'i': o.iters = std::atoi(optarg); break;
      case 'w': o.warmup = std::atoi(optarg); break;
      case 'b': o.bucket_cap_mb = std::atoll(optarg); break;
      case 'x': o.wire = std::strcmp(optarg, "fp16") == 0 ? COMM_FLOAT16 : std::strcmp(optarg, "bf16") == 0 ? COMM_BFLOAT16 : -2; break;
      case 'g': o.grad_view = true; break;
      case 'h': usage(); return 0;
      default: usage(); return 2;
    }
  }
  if (o.wire == -2 || o.layers < 0 || o.d_model <= 0 || o.iters <= 0) {
    usage();
    return 2;
  }
  comm_config_t cfg = COMM_CONFIG_INIT;
  comm_t comm = nullptr;
  ok(comm_init(&cfg, &comm), "comm_init");
  int rank = 0, size = 1;
  comm_rank(comm, &rank);
  comm_size(comm, &size);

  int num_layers = 0;
  const std::vector<Tensor> tensors = layer_list(o, &num_layers);
  size_t total = 0;
  for (const auto& t : tensors) total += t.count;

  comm_engine_config_t ecfg = COMM_ENGINE_CONFIG_INIT;
  if (o.bucket_cap_mb > 0) ecfg.bucket_cap_bytes = o.bucket_cap_mb << 20;
  ecfg.wire_dtype = o.wire;
  ecfg.gradient_as_bucket_view = o.grad_view ? 1 : 0;
  comm_engine_t eng = nullptr;
  ok(comm_engine_create(comm, &ecfg, &eng), "comm_engine_create");
  for (const auto& t : tensors) {
    int idx;
    ok(comm_engine_register(eng, t.count, COMM_FLOAT32, &idx), "comm_engine_register");
  }
  ok(comm_engine_finalize(eng), "comm_engine_finalize");
  // The framework's gradients, allocated and touched once (or the engine's views).
  std::vector<std::vector<float>> own(tensors.size());
  std::vector<float*> grad(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (o.grad_view) {
      void* p;
      ok(comm_engine_grad_view(eng, static_cast<int>(i), &p), "comm_engine_grad_view");
      grad[i] = static_cast<float*>(p);
      std::fill(grad[i], grad[i] + tensors[i].count, 0.001f * static_cast<float>(rank + 1));
    } else {
      own[i].assign(tensors[i].count, 0.001f * static_cast<float>(rank + 1));
      grad[i] = own[i].data();
    }
  }
  // Per-layer share of the backward, by parameter count (FLOPs of a matmul layer), except the
  // embedding: its backward is a scatter-add, next to nothing.
  std::vector<size_t> layer_params(static_cast<size_t>(num_layers), 0);
  for (const auto& t : tensors)
    if (t.layer > 0) layer_params[static_cast<size_t>(t.layer)] += t.count;
  size_t compute_params = 0;
  for (size_t n : layer_params) compute_params += n;

  auto run_comm = [&] {
    ok(comm_engine_begin(eng, 1), "comm_engine_begin");
    for (size_t i = tensors.size(); i-- > 0;) ok(comm_engine_grad_ready(eng, static_cast<int>(i), grad[i]), "grad_ready");
    ok(comm_engine_end(eng), "comm_engine_end");
  };
  auto backward = [&](bool with_engine, double compute_ms) {
    if (with_engine) ok(comm_engine_begin(eng, 1), "comm_engine_begin");
    size_t i = tensors.size();
    for (int l = num_layers - 1; l >= 0; --l) {
      compute_for(compute_ms * static_cast<double>(layer_params[static_cast<size_t>(l)]) / static_cast<double>(compute_params), o.spin);
      while (i > 0 && tensors[i - 1].layer == l) {
        --i;
        if (with_engine) ok(comm_engine_grad_ready(eng, static_cast<int>(i), grad[i]), "grad_ready");
      }
    }
    if (with_engine) ok(comm_engine_end(eng), "comm_engine_end");
  };
  auto timed = [&](auto&& f) {
    ok(comm_barrier(comm, nullptr), "comm_barrier");
    const double t0 = now_ms();
    f();
    double t = now_ms() - t0;
    // The slowest rank's time is the step's.
    ok(comm_allreduce(comm, &t, &t, 1, COMM_FLOAT64, COMM_MAX, nullptr), "comm_allreduce");
    return t;
  };

  for (int w = 0; w < o.warmup; ++w) timed(run_comm);
  if (o.compute_ms < 0) {
    std::vector<double> c;
    for (int k = 0; k < 3; ++k) c.push_back(timed(run_comm));
    o.compute_ms = median(c);
  }
  std::vector<double> compute, comm_only, step, exposed, overlap;
  for (int it = 0; it < o.iters; ++it) {
    compute.push_back(timed([&] { backward(false, o.compute_ms); }));
    comm_only.push_back(timed(run_comm));
    step.push_back(timed([&] { backward(true, o.compute_ms); }));
    comm_engine_stats_t st;
    st.size = sizeof st;
    ok(comm_engine_stats(eng, &st), "comm_engine_stats");
    double e = st.exposed_comm_us / 1000;
    ok(comm_allreduce(comm, &e, &e, 1, COMM_FLOAT64, COMM_MAX, nullptr), "comm_allreduce");
    exposed.push_back(e);
    overlap.push_back(st.overlap_ratio);
  }
  comm_engine_stats_t st;
  st.size = sizeof st;
  ok(comm_engine_stats(eng, &st), "comm_engine_stats");
  if (rank == 0) {
    const double c = median(compute), m = median(comm_only), s = median(step);
    std::printf("# engine-bench: %d ranks, %zu tensors, %.1fM float32 parameters (%.0f MB), %d buckets, compute %s, wire %s%s\n",
                size, tensors.size(), static_cast<double>(total) / 1e6, static_cast<double>(total) * 4 / 1e6,
                st.num_buckets, o.spin ? "spin" : "wait", o.wire == COMM_FLOAT16 ? "fp16" : o.wire == COMM_BFLOAT16 ? "bf16" : "float32",
                o.grad_view ? ", gradient-as-bucket-view" : "");
    std::printf("# medians of %d iterations (compute, comm, step alternating; the slowest rank's time)\n", o.iters);
    std::printf("%6s %12s %12s %12s %12s %14s %12s %9s\n", "ranks", "compute_ms", "comm_ms", "step_ms", "max_ms",
                "step/max", "exposed_ms", "overlap");
    std::printf("%6d %12.1f %12.1f %12.1f %12.1f %14.3f %12.1f %9.2f\n", size, c, m, s, std::max(c, m),
                s / std::max(c, m), median(exposed), median(overlap));
  }
  ok(comm_engine_destroy(eng), "comm_engine_destroy");
  ok(comm_destroy(comm), "comm_destroy");
  return 0;
}

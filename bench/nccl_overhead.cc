// nccl-overhead: libcomm's cost per call over raw NCCL on device buffers, one GPU, world size 1,
// the same sizes and the same stream, alternating which goes first in each round. For each size:
// the host time to enqueue a call (what libcomm adds to the caller) and the time per call with
// the GPU's work included (n calls back to back, then one synchronise), raw NCCL against
// comm_allreduce on a communicator with COMM_TRANSPORT=nccl. Run by tools/gpu-check.
//   nccl-overhead [-n ITERS] [-r ROUNDS] [--big BYTES]
#include <comm/comm.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dl/cuda_library.h"
#include "dl/nccl_library.h"

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int die(const std::string& why) {
  std::fprintf(stderr, "nccl-overhead: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 200, rounds = 9;
  size_t big = size_t{256} << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "-n")) iters = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-r")) rounds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--big")) big = std::strtoull(argv[i + 1], nullptr, 10);
    else return die(std::string("unknown option ") + argv[i] + " (use -n ITERS -r ROUNDS --big BYTES)");
  }
  // The libraries libcomm itself opens (COMM_CUDA_LIBRARY / COMM_NCCL_LIBRARY point elsewhere).
  const char* cuda_path = std::getenv("COMM_CUDA_LIBRARY");
  const char* nccl_path = std::getenv("COMM_NCCL_LIBRARY");
  const auto& cuda = comm::dl::cuda_library(cuda_path ? cuda_path : "");
  const auto& nccl = comm::dl::nccl_library(nccl_path ? nccl_path : "");
  if (!cuda.usable()) return die(cuda.why_not);
  if (!nccl.usable()) return die(nccl.why_not);
  (void)cuda.cudaSetDevice(0);
  cudaStream_t stream = nullptr;
  if (cuda.cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return die("cudaStreamCreate failed");
  void *send = nullptr, *recv = nullptr;
  if (cuda.cudaMalloc(&send, big) != cudaSuccess || cuda.cudaMalloc(&recv, big) != cudaSuccess)
    return die("cudaMalloc of 2 x " + std::to_string(big) + " bytes failed");
  std::vector<float> host(big / sizeof(float));
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 1000);
  (void)cuda.cudaMemcpy(send, host.data(), big, cudaMemcpyHostToDevice);

  ncclUniqueId id{};
  ncclComm_t raw = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (nccl.ncclGetUniqueId(&id) != ncclSuccess || nccl.ncclCommInitRankConfig(&raw, 1, id, 0, &config) != ncclSuccess)
    return die("raw NCCL init failed: " + nccl.error_text(ncclInternalError));

  comm_config_t cfg = COMM_CONFIG_INIT;
  cfg.init_method = "memory://nccl-overhead";
  cfg.rank = 0;
  cfg.world_size = 1;
  cfg.transport = "nccl";
  comm_t comm = nullptr;
  if (comm_init(&cfg, &comm) != COMM_OK) return die(std::string("comm_init (COMM_TRANSPORT=nccl) failed: ") + comm_last_error(nullptr));

  // Correctness: one rank's sum is its input, through libcomm's NCCL path.
  if (comm_allreduce(comm, send, recv, big / sizeof(float), COMM_FLOAT32, COMM_SUM, stream) != COMM_OK)
    return die(std::string("comm_allreduce failed: ") + comm_last_error(comm));
  (void)cuda.cudaStreamSynchronize(stream);
  std::vector<float> back(host.size());
  (void)cuda.cudaMemcpy(back.data(), recv, big, cudaMemcpyDeviceToHost);
  const bool correct = back == host;
  std::printf("# correctness: comm_allreduce of %zu floats on device buffers over NCCL: %s\n", host.size(),
              correct ? "OK" : "WRONG");

  using Call = std::function<bool(size_t)>;
  const Call call_raw = [&](size_t n) {
    return nccl.ncclAllReduce(send, recv, n, ncclFloat32, ncclSum, raw, stream) == ncclSuccess;
  };
  const Call call_lib = [&](size_t n) {
    return comm_allreduce(comm, send, recv, n, COMM_FLOAT32, COMM_SUM, stream) == COMM_OK;
  };
  // (enqueue us/call, total us/call) for `n` calls back to back.
  auto measure = [&](const Call& call, size_t count, int n, double* enqueue, double* total) {
    (void)cuda.cudaStreamSynchronize(stream);
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i)
      if (!call(count)) return false;
    *enqueue = us_since(t0) / n;
    (void)cuda.cudaStreamSynchronize(stream);
    *total = us_since(t0) / n;
    return true;
  };

  std::vector<size_t> sizes;
  for (size_t b = 8; b <= 64 * 1024; b *= 8) sizes.push_back(b);
  sizes.push_back(big);
  std::printf("# NCCL %s, %s; world size 1; %d calls per round, %d rounds alternating, medians\n",
              nccl.version_text().c_str(), cuda.path.c_str(), iters, rounds);
  std::printf("# %10s  %12s %12s %10s  %12s %12s %10s  %9s %9s\n", "bytes", "enq raw us", "enq libcomm", "enq +us",
              "call raw us", "call libcomm", "call +us", "raw GB/s", "lib GB/s");
  double worst_overhead = 0, big_ratio = 0;
  for (size_t bytes : sizes) {
    const size_t count = bytes / sizeof(float);
    const int n = bytes >= (size_t{1} << 24) ? std::max(5, iters / 20) : iters;
    double e = 0, t = 0;
    measure(call_raw, count, n, &e, &t);  // warm-up for both
    measure(call_lib, count, n, &e, &t);
    std::vector<double> er, el, tr, tl;
    for (int r = 0; r < rounds; ++r) {
      double e1, t1, e2, t2;
      const bool raw_first = r % 2 == 0;
      if (!measure(raw_first ? call_raw : call_lib, count, n, &e1, &t1) ||
          !measure(raw_first ? call_lib : call_raw, count, n, &e2, &t2))
        return die(std::string("a call failed: ") + comm_last_error(comm));
      er.push_back(raw_first ? e1 : e2);
      el.push_back(raw_first ? e2 : e1);
      tr.push_back(raw_first ? t1 : t2);
      tl.push_back(raw_first ? t2 : t1);
    }
    const double mer = median(er), mel = median(el), mtr = median(tr), mtl = median(tl);
    const double bw_raw = static_cast<double>(bytes) / mtr / 1e3, bw_lib = static_cast<double>(bytes) / mtl / 1e3;
    std::printf("  %10zu  %12.2f %12.2f %+10.2f  %12.2f %12.2f %+10.2f  %9.2f %9.2f\n", bytes, mer, mel, mel - mer, mtr,
                mtl, mtl - mtr, bw_raw, bw_lib);
    if (bytes <= 64 * 1024) worst_overhead = std::max(worst_overhead, std::max(mel - mer, mtl - mtr));
    if (bytes == big) big_ratio = bw_lib / bw_raw;
  }
  std::printf("# SUMMARY per-call overhead over raw NCCL, 8 B - 64 KiB: at most %.2f us (target < 2 us): %s\n",
              worst_overhead, worst_overhead < 2 ? "MET" : "MISSED");
  std::printf("# SUMMARY bandwidth at %zu MiB: libcomm / raw NCCL = %.4f (target >= 0.99): %s\n", big >> 20, big_ratio,
              big_ratio >= 0.99 ? "MET" : "MISSED");
  comm_destroy(comm);
  (void)nccl.ncclCommDestroy(raw);
  (void)cuda.cudaFree(send);
  (void)cuda.cudaFree(recv);
  return correct ? 0 : 1;
}

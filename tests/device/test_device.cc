// Device buffers on a machine without a GPU: asking for NCCL fails on every rank saying why
// (library not found, no CUDA device, driver too old), auto falls back to the host transports,
// and the staged path (pinned host memory onto the host transports) gives the host path's
// results, run here over a CUDA runtime without a GPU (fake_cudart.cc, via COMM_CUDA_LIBRARY).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "../abi/harness.h"
#include "fakes.h"

namespace {

using namespace abi;
using namespace devtest;

bool machine_has_gpu() { return access("/dev/nvidiactl", F_OK) == 0; }

void expect_unavailable_everywhere(const Ranks& ranks, const std::vector<std::string>& any_of) {
  INFO(ranks.describe());
  for (const auto& o : ranks.outcomes) {
    CHECK(o.status == COMM_ERR_UNAVAILABLE);
    bool said_why = false;
    for (const auto& why : any_of) said_why = said_why || icontains(o.message, why);
    CHECK(said_why);
    CHECK(icontains(o.message, "COMM_TRANSPORT=nccl"));
  }
}


}  // namespace

TEST_CASE("COMM_TRANSPORT=nccl without libnccl: COMM_ERR_UNAVAILABLE on every rank, saying the library is not found",
          "[device]") {
  EnvGuard lib("COMM_NCCL_LIBRARY", "/nonexistent/libnccl.so.2");
  Ranks ranks = init_ranks(3, "nccl-missing", 20000, [](int, comm_config_t& cfg) { cfg.transport = "nccl"; });
  expect_unavailable_everywhere(ranks, {"NCCL library not found"});
  for (const auto& o : ranks.outcomes) CHECK(icontains(o.message, "/nonexistent/libnccl.so.2"));
  destroy_ranks(ranks.comms);
}

TEST_CASE("COMM_TRANSPORT=nccl with the real libraries and no GPU: COMM_ERR_UNAVAILABLE on every rank, saying why",
          "[device]") {
  if (machine_has_gpu()) {
    WARN("this machine has an NVIDIA device; tools/gpu-check covers it");
    return;
  }
  EnvGuard env("COMM_TRANSPORT", "nccl");  // the environment's way, not only the config's
  Ranks ranks = init_ranks(2, "nccl-nodevice", 20000);
  // Here: libnccl.so.2 and libcudart.so.13 load, and there is no driver or no device.
  expect_unavailable_everywhere(ranks, {"no CUDA device", "driver too old", "NCCL library not found",
                                        "CUDA runtime library not found"});
  for (const auto& o : ranks.outcomes) CHECK(icontains(o.message, "rank 0: "));  // whose reason it is
  destroy_ranks(ranks.comms);
}

TEST_CASE("COMM_TRANSPORT=nccl without a CUDA runtime names the runtime", "[device]") {
  EnvGuard lib("COMM_CUDA_LIBRARY", "/nonexistent/libcudart.so.13");
  Ranks ranks = init_ranks(2, "cudart-missing", 20000, [](int, comm_config_t& cfg) { cfg.transport = "nccl"; });
  expect_unavailable_everywhere(ranks, {"CUDA runtime library not found", "NCCL library not found"});
  destroy_ranks(ranks.comms);
}

TEST_CASE("auto without CUDA: host collectives run, a stream is COMM_ERR_UNAVAILABLE on every rank, the communicator "
          "stays usable", "[device]") {
  EnvGuard lib("COMM_CUDA_LIBRARY", "/nonexistent/libcudart.so.13");
  Ranks ranks = init_ranks(2, "auto-nocuda", 20000);
  REQUIRE(ranks.all_ok());
  auto out = on_ranks(2, [&](int r) {
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    float in[4] = {1, 2, 3, static_cast<float>(r)}, res[4] = {};
    Outcome dev = timed(c, [&] { return comm_allreduce(c, in, res, 4, COMM_FLOAT32, COMM_SUM, kStream); });
    Outcome host = timed(c, [&] { return comm_allreduce(c, in, res, 4, COMM_FLOAT32, COMM_SUM, nullptr); });
    return std::make_pair(dev, host.status == COMM_OK && res[0] == 2 && res[3] == 1 ? "ok" : describe(host));
  });
  for (const auto& [dev, host] : out) {
    INFO(describe(dev));
    CHECK(dev.status == COMM_ERR_UNAVAILABLE);
    CHECK(icontains(dev.message, "CUDA runtime library not found"));
    CHECK(icontains(dev.message, "comm_allreduce"));
    CHECK(host == "ok");
  }
  destroy_ranks(ranks.comms);
}

namespace {

// Every collective on "device" buffers through the staged path, checked against the values
// the host path gives (small integers in float: exact in any order).
std::string run_staged_collectives(int n, const char* transport) {
  FakeDevice dev;
  if (!dev.lib || !dev.malloc_fn) return "cannot open " FAKE_CUDART;
  Ranks ranks = init_ranks(n, std::string("staged-") + (transport ? transport : "auto"), 20000,
                           [&](int, comm_config_t& cfg) { cfg.transport = transport; });
  if (!ranks.all_ok()) return ranks.describe();
  Failures failures;
  on_ranks(n, [&](int r) {
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    const size_t count = 1000, big = count * static_cast<size_t>(n);
    float* send = dev.alloc(big);
    float* recv = dev.alloc(big);
    auto check = [&](const char* what, comm_status_t st, size_t elems, auto expected) {
      if (st != COMM_OK) return failures.add(std::string(what) + ": " + status_name(st) + " " + last_error(c));
      for (size_t i = 0; i < elems; ++i)
        if (recv[i] != expected(i))
          return failures.add(std::string(what) + " rank " + std::to_string(r) + " element " + std::to_string(i) + ": " +
                              std::to_string(recv[i]) + " != " + std::to_string(expected(i)));
    };
    const float sum_r = static_cast<float>(n * (n - 1) / 2);
    for (size_t i = 0; i < big; ++i) send[i] = static_cast<float>(r + 1) * static_cast<float>(i % 7);
    check("allreduce", comm_allreduce(c, send, recv, count, COMM_FLOAT32, COMM_SUM, kStream), count,
          [&](size_t i) { return (sum_r + static_cast<float>(n)) * static_cast<float>(i % 7); });
    for (size_t i = 0; i < count; ++i) recv[i] = static_cast<float>(r);
    check("allreduce in place", comm_allreduce(c, recv, recv, count, COMM_FLOAT32, COMM_MAX, kStream), count,
          [&](size_t) { return static_cast<float>(n - 1); });
    check("allgather", comm_allgather(c, send, recv, count, COMM_FLOAT32, kStream), big, [&](size_t i) {
      return static_cast<float>(i / count + 1) * static_cast<float>(i % count % 7);
    });
    check("reduce_scatter", comm_reduce_scatter(c, send, recv, count, COMM_FLOAT32, COMM_SUM, kStream), count,
          [&](size_t i) { return (sum_r + static_cast<float>(n)) * static_cast<float>((static_cast<size_t>(r) * count + i) % 7); });
    check("broadcast", comm_broadcast(c, send, recv, count, COMM_FLOAT32, n - 1, kStream), count,
          [&](size_t i) { return static_cast<float>(n) * static_cast<float>(i % 7); });
    for (size_t i = 0; i < count; ++i) recv[i] = -1;
    const comm_status_t st = comm_reduce(c, send, r == 0 ? recv : nullptr, count, COMM_FLOAT32, COMM_SUM, 0, kStream);
    if (r == 0)
      check("reduce", st, count, [&](size_t i) { return (sum_r + static_cast<float>(n)) * static_cast<float>(i % 7); });
    else if (st != COMM_OK)
      failures.add("reduce: " + status_name(st) + " " + last_error(c));
    check("alltoall", comm_alltoall(c, send, recv, count, COMM_FLOAT32, kStream), big, [&](size_t i) {
      return static_cast<float>(i / count + 1) * static_cast<float>((static_cast<size_t>(r) * count + i % count) % 7);
    });
    const int next = (r + 1) % n, prev = (r + n - 1) % n;  // one rank: a send to itself needs a group
    if (n > 1) {
    comm_status_t sr = r % 2 == 0 ? comm_send(c, send, count, COMM_FLOAT32, next, kStream)
                                  : comm_recv(c, recv, count, COMM_FLOAT32, prev, kStream);
    if (sr == COMM_OK)
      sr = r % 2 == 0 ? comm_recv(c, recv, count, COMM_FLOAT32, prev, kStream)
                      : comm_send(c, send, count, COMM_FLOAT32, next, kStream);
    check("send/recv", sr, count, [&](size_t i) { return static_cast<float>(prev + 1) * static_cast<float>(i % 7); });
    }
    // Inside a group (comm-bench's sendrecv): a ring, each rank sending to the next, one rank to itself.
    for (size_t i = 0; i < count; ++i) recv[i] = -1;
    comm_status_t g = comm_group_start();
    if (g == COMM_OK) g = comm_send(c, send, count, COMM_FLOAT32, next, kStream);
    if (g == COMM_OK) g = comm_recv(c, recv, count, COMM_FLOAT32, prev, kStream);
    const comm_status_t ended = comm_group_end();
    check("send/recv in a group", g == COMM_OK ? ended : g, count,
          [&](size_t i) { return static_cast<float>(prev + 1) * static_cast<float>(i % 7); });
    if (comm_barrier(c, kStream) != COMM_OK) failures.add("barrier: " + last_error(c));
    // Host memory with a stream is a local mistake: INVALID_ARGUMENT, and the communicator goes on.
    std::vector<float> host(count);
    if (comm_allreduce(c, host.data(), host.data(), count, COMM_FLOAT32, COMM_SUM, kStream) != COMM_ERR_INVALID_ARGUMENT ||
        !icontains(last_error(c), "ordinary host memory"))
      failures.add("host memory with a stream: " + last_error(c));
    check("allreduce after the bad call", comm_allreduce(c, send, recv, count, COMM_FLOAT32, COMM_SUM, kStream), count,
          [&](size_t i) { return (sum_r + static_cast<float>(n)) * static_cast<float>(i % 7); });
    dev.free_fn(send);
    dev.free_fn(recv);
  });
  destroy_ranks(ranks.comms);
  return failures.summary();
}

}  // namespace

TEST_CASE("staged: without libnccl, device buffers run through pinned host memory with the host path's results",
          "[device]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", FAKE_CUDART);
  EnvGuard nccl("COMM_NCCL_LIBRARY", "/nonexistent/libnccl.so.2");
  for (int n : {1, 2, 3}) {
    INFO(n << " ranks");
    CHECK(run_staged_collectives(n, nullptr) == "");
  }
}

TEST_CASE("staged: COMM_TRANSPORT=socket keeps device buffers off NCCL even where NCCL loads", "[device]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", FAKE_CUDART);
  CHECK(run_staged_collectives(2, "socket") == "");
}

TEST_CASE("staged: two ranks on one GPU of one host never reach NCCL (it refuses them)", "[device]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", FAKE_CUDART);  // one fake GPU, the real libnccl.so.2
  CHECK(run_staged_collectives(2, nullptr) == "");
}

// ---- the NCCL path, over an NCCL and a CUDA runtime without a GPU (fake_nccl.cc, fake_cudart.cc) ----
namespace {

void fake_hang(int on) {
  void* lib = dlopen(FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
  reinterpret_cast<void (*)(int)>(dlsym(lib, "fake_cuda_hang"))(on);
}

// Waits (bounded) until the watchdog has recorded an error on the communicator.
comm_status_t async_error_within(comm_t c, double ms) {
  const double until = now_ms() + ms;
  comm_status_t s = COMM_OK;
  while ((s = comm_get_async_error(c)) == COMM_OK && now_ms() < until) usleep(2000);
  return s;
}

}  // namespace

TEST_CASE("NCCL path, 1 rank: every collective goes to NCCL on the stream; comm_mem_alloc gives NCCL-registered memory",
          "[device]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", FAKE_CUDART);
  EnvGuard nccl("COMM_NCCL_LIBRARY", FAKE_NCCL);
  FakeNccl fake;
  FakeDevice dev;
  REQUIRE(fake.lib != nullptr);
  Ranks ranks = init_ranks(1, "fake-nccl-1", 20000, [](int, comm_config_t& cfg) { cfg.transport = "nccl"; });
  INFO(ranks.describe());
  REQUIRE(ranks.all_ok());
  comm_t c = ranks.comms[0];
  const size_t n = 257;
  float* send = dev.alloc(n);
  float* recv = dev.alloc(n);
  for (size_t i = 0; i < n; ++i) send[i] = static_cast<float>(i);
  auto same = [&] { return std::memcmp(send, recv, n * sizeof(float)) == 0; };
  const int before = fake.count("fake_nccl_allreduces");
  std::memset(recv, 0, n * sizeof(float));
  CHECK(comm_allreduce(c, send, recv, n, COMM_FLOAT32, COMM_SUM, kStream) == COMM_OK);
  CHECK(same());
  CHECK(fake.count("fake_nccl_allreduces") == before + 1);
  for (auto call : std::vector<std::function<comm_status_t()>>{
           [&] { return comm_broadcast(c, send, recv, n, COMM_FLOAT32, 0, kStream); },
           [&] { return comm_reduce(c, send, recv, n, COMM_FLOAT32, COMM_SUM, 0, kStream); },
           [&] { return comm_allgather(c, send, recv, n, COMM_FLOAT32, kStream); },
           [&] { return comm_reduce_scatter(c, send, recv, n, COMM_FLOAT32, COMM_SUM, kStream); },
           [&] { return comm_alltoall(c, send, recv, n, COMM_FLOAT32, kStream); },
           [&] {
             comm_group_start();
             comm_send(c, send, n, COMM_FLOAT32, 0, kStream);
             comm_recv(c, recv, n, COMM_FLOAT32, 0, kStream);
             return comm_group_end();
           }}) {
    std::memset(recv, 0, n * sizeof(float));
    CHECK(call() == COMM_OK);
    CHECK(same());
  }
  CHECK(comm_barrier(c, kStream) == COMM_OK);
  void* mem = nullptr;
  const int allocs = fake.count("fake_nccl_mem_allocs"), regs = fake.count("fake_nccl_registrations");
  CHECK(comm_mem_alloc(c, 4096, &mem) == COMM_OK);
  CHECK(mem != nullptr);
  CHECK(fake.count("fake_nccl_mem_allocs") == allocs + 1);
  CHECK(fake.count("fake_nccl_registrations") == regs + 1);
  CHECK(comm_mem_free(c, mem) == COMM_OK);
  dev.free_fn(send);
  dev.free_fn(recv);
  destroy_ranks(ranks.comms);
}

TEST_CASE("NCCL path, 3 ranks with a GPU each (auto, made at the first device call): sums across ranks", "[device]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", FAKE_CUDART);
  EnvGuard nccl("COMM_NCCL_LIBRARY", FAKE_NCCL);
  FakeNccl fake;
  FakeDevice dev;
  Ranks ranks = init_ranks(3, "fake-nccl-3", 20000);
  REQUIRE(ranks.all_ok());
  const int before = fake.count("fake_nccl_allreduces");
  Failures failures;
  on_ranks(3, [&](int r) {
    fake_set_device(r);  // one GPU per rank: NCCL, not staged
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    float* buf = dev.alloc(100);
    for (int i = 0; i < 100; ++i) buf[i] = static_cast<float>(r + i);
    for (int step = 0; step < 2; ++step)
      if (comm_allreduce(c, buf, buf, 100, COMM_FLOAT32, COMM_SUM, kStream) != COMM_OK)
        failures.add("allreduce: " + last_error(c));
    for (int i = 0; i < 100; ++i)
      if (buf[i] != static_cast<float>(3 * (3 + 3 * i))) failures.add("rank " + std::to_string(r) + " element " + std::to_string(i));
    dev.free_fn(buf);
  });
  CHECK(failures.summary() == "");
  CHECK(fake.count("fake_nccl_allreduces") == before + 2);
  destroy_ranks(ranks.comms);
}

TEST_CASE("comm_shrink on an NCCL communicator whose NCCL lacks ncclCommShrink: COMM_ERR_UNAVAILABLE naming the "
          "version, and the communicator still works", "[device]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", FAKE_CUDART);
  EnvGuard nccl("COMM_NCCL_LIBRARY", FAKE_NCCL);  // 2.23.4: before ncclCommShrink (2.27)
  FakeNccl fake;
  FakeDevice dev;
  Ranks ranks = init_ranks(1, "fake-nccl-shrink", 20000, [](int, comm_config_t& cfg) { cfg.transport = "nccl"; });
  INFO(ranks.describe());
  REQUIRE(ranks.all_ok());
  comm_t c = ranks.comms[0];
  comm_t out = nullptr;
  CHECK(comm_shrink(c, nullptr, 0, &out) == COMM_ERR_UNAVAILABLE);
  CHECK(out == nullptr);
  CHECK(icontains(last_error(c), "ncclCommShrink"));
  CHECK(icontains(last_error(c), "2.23.4"));
  float* buf = dev.alloc(4);
  CHECK(comm_allreduce(c, buf, buf, 4, COMM_FLOAT32, COMM_SUM, kStream) == COMM_OK);  // nothing moved, nothing broke
  dev.free_fn(buf);
  destroy_ranks(ranks.comms);
}

TEST_CASE("NCCL's asynchronous error: the watchdog aborts NCCL and the communicator fails with COMM_ERR_REMOTE",
          "[device]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", FAKE_CUDART);
  EnvGuard nccl("COMM_NCCL_LIBRARY", FAKE_NCCL);
  FakeNccl fake;
  FakeDevice dev;
  Ranks ranks = init_ranks(1, "fake-nccl-async", 20000, [](int, comm_config_t& cfg) { cfg.transport = "nccl"; });
  REQUIRE(ranks.all_ok());
  comm_t c = ranks.comms[0];
  const int aborts = fake.count("fake_nccl_aborts");
  fake.set_async_error(6);  // ncclRemoteError
  CHECK(async_error_within(c, loaded_host::kSlackMs) == COMM_ERR_REMOTE);  // the watchdog's next look; 20 s timeout
  fake.set_async_error(0);
  float* buf = dev.alloc(4);
  CHECK(comm_allreduce(c, buf, buf, 4, COMM_FLOAT32, COMM_SUM, kStream) == COMM_ERR_REMOTE);
  const std::string msg = last_error(c);
  INFO(msg);
  CHECK(icontains(msg, "rank 0, comm_allreduce"));
  CHECK(!icontains(msg.substr(1), "rank 0, "));  // the rank said once, with the operation
  CHECK(icontains(msg, "ncclRemoteError"));
  CHECK(icontains(msg, "the fake NCCL says so"));  // ncclGetLastError's text
  CHECK(icontains(msg, "make a new one"));
  CHECK(fake.count("fake_nccl_aborts") == aborts + 1);
  dev.free_fn(buf);
  destroy_ranks(ranks.comms);
}

TEST_CASE("an NCCL call that never completes: COMM_ERR_TIMEOUT after the communicator's timeout", "[device]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", FAKE_CUDART);
  EnvGuard nccl("COMM_NCCL_LIBRARY", FAKE_NCCL);
  FakeNccl fake;
  FakeDevice dev;
  Ranks ranks = init_ranks(1, "fake-nccl-hang", 300, [](int, comm_config_t& cfg) { cfg.transport = "nccl"; });
  REQUIRE(ranks.all_ok());
  comm_t c = ranks.comms[0];
  float* buf = dev.alloc(4);
  fake_hang(1);  // the stream never gets past the call
  CHECK(comm_allreduce(c, buf, buf, 4, COMM_FLOAT32, COMM_SUM, kStream) == COMM_OK);  // enqueued
  const double t0 = now_ms();
  CHECK(async_error_within(c, 300 + loaded_host::kSlackMs) == COMM_ERR_TIMEOUT);
  CHECK(now_ms() - t0 < 300 + loaded_host::kSlackMs);  // the 300 ms timeout ended it, not a hang
  fake_hang(0);
  CHECK(comm_allreduce(c, buf, buf, 4, COMM_FLOAT32, COMM_SUM, kStream) == COMM_ERR_TIMEOUT);
  CHECK(icontains(last_error(c), "has not completed"));
  dev.free_fn(buf);
  destroy_ranks(ranks.comms);
}

TEST_CASE("comm_abort aborts the NCCL communicator; later device calls are COMM_ERR_ABORTED", "[device]") {
  EnvGuard cuda("COMM_CUDA_LIBRARY", FAKE_CUDART);
  EnvGuard nccl("COMM_NCCL_LIBRARY", FAKE_NCCL);
  FakeNccl fake;
  FakeDevice dev;
  Ranks ranks = init_ranks(1, "fake-nccl-abort", 20000, [](int, comm_config_t& cfg) { cfg.transport = "nccl"; });
  REQUIRE(ranks.all_ok());
  comm_t c = ranks.comms[0];
  const int aborts = fake.count("fake_nccl_aborts");
  CHECK(comm_abort(c) == COMM_OK);
  const double until = now_ms() + loaded_host::kSlackMs;  // ends when seen; a busy host may be late
  while (fake.count("fake_nccl_aborts") == aborts && now_ms() < until) usleep(2000);
  CHECK(fake.count("fake_nccl_aborts") == aborts + 1);
  float* buf = dev.alloc(4);
  CHECK(comm_allreduce(c, buf, buf, 4, COMM_FLOAT32, COMM_SUM, kStream) == COMM_ERR_ABORTED);
  dev.free_fn(buf);
  destroy_ranks(ranks.comms);
}

// Receives from any rank (COMM_ANY_SOURCE, comm_recv_any, comm_irecv_any; ABI 1.7) between real
// processes: several senders, each sender's messages in the order sent, directed receives mixed
// in (the earlier-posted receive takes a rank's message), large messages, and the deadline.
// Over shared memory (every rank on this host, the default choice), sockets and UCX (the meson
// tests abi-any-source-socket and -ucx set ABI_TRANSPORT), and the routed transport: with
// ABI_ANY_SOURCE_ROUTED (abi-any-source-routed, -routed-ucx) the ranks are two "hosts"
// (COMM_HOST_ID), shared memory inside each and sockets or UCX between. One at a time: the last
// one measures a deadline.
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "harness.h"
#include "process_harness.h"

namespace {

using namespace abi;

// ABI_ANY_SOURCE_ROUTED=shm+socket or shm+ucx: the job's routed transport. Rank r of n is on
// "host" 2r/n (COMM_HOST_ID); for shm+ucx the plan is told the hosts have InfiniBand
// (COMM_TOPO_XML), so it picks UCX between them.
std::string routed() {
  const char* t = std::getenv("ABI_ANY_SOURCE_ROUTED");
  return t == nullptr ? "" : t;
}
Env host_env(int r, int n, Env env = {}) {
  if (routed().empty()) return env;
  env.emplace_back("COMM_HOST_ID", "host-" + std::to_string(r * 2 / n));
  if (routed() == "shm+ucx") {
    env.emplace_back("COMM_TOPO_XML", std::string(ABI_SOURCE_ROOT) + "/tests/fixtures/nccl-topo/ndv4-topo.xml");
    env.emplace_back("UCX_TLS", "tcp,self");
  }
  return env;
}

void any_source_job(int n) {
  TempDir dir;
  const int port = free_port();
  Job job = run_job(dir, "any_source", n, [&](int r) { return torchrun_env(r, n, port, 60000, host_env(r, n)); }, 240000);
  INFO(describe_all(job.procs));
  CHECK(job.ended);
  check_done_and_identical(job.procs, 0, /*every_label_on_rank0=*/false);
}

}  // namespace

TEST_CASE("any source: 3 ranks send to rank 0, which receives from any rank: every message once, the source "
          "reported, each sender's messages in order, directed receives mixed in, large messages",
          "[any_source]") {
  any_source_job(3);
}

TEST_CASE("any source: the same with 4 ranks", "[any_source]") { any_source_job(4); }

TEST_CASE("any source: a receive from any rank that nobody sends to ends with COMM_ERR_TIMEOUT after the "
          "communicator's timeout, naming the receive from any rank",
          "[any_source]") {
  TempDir dir;
  const int n = 3, port = free_port(), timeout_ms = 1500;
  const std::string done = dir.file("rank0-done");
  Job job = run_job(dir, "any_source_timeout", n, [&](int r) {
    return torchrun_env(r, n, port, timeout_ms, host_env(r, n, {{"ABI_ANY_SOURCE_DONE", done}}));
  }, 150000);
  INFO(describe_all(job.procs));
  CHECK(job.ended);
  const std::string out = job.procs[0].output();
  const std::string end = line_after(out, "END ").value_or("");
  REQUIRE(!end.empty());
  CHECK(end.rfind("4 ", 0) == 0);  // COMM_ERR_TIMEOUT
  const long ms = std::stol(end.substr(2));
  CHECK(ms >= timeout_ms - 100);                        // not before the timeout
  CHECK(ms <= timeout_ms + loaded_host::kSlackMs);      // and not a hang
  CHECK(end.substr(end.rfind(' ') + 1) == "-2");        // *source stays COMM_ANY_SOURCE
  const std::string msg = line_after(out, "MSG ").value_or("");
  INFO(msg);
  CHECK(msg.find("receive from any rank (COMM_ANY_SOURCE") != std::string::npos);
  CHECK(msg.find("COMM_TIMEOUT_MS") != std::string::npos);
  if (!routed().empty()) CHECK(msg.find(", " + routed() + ")") != std::string::npos);  // it answered
}

// Host collective algorithms, ranks as threads over an in-process fabric: every collective x
// algorithm x dtype x op x count x rank count, out of place and in place, against a float64
// (floats) or wrap-exact (integers) reference, with all ranks' results compared bit for bit.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/scratch.h"
#include "dtype.h"
#include "support/collective_check.h"
#include "support/loaded_host.h"
#include "support/inproc_transport.h"

using comm::Status;
using comm::algo::Algorithm;
using comm::algo::CollArgs;
using comm::algo::Context;
using comm::transport::CollKind;
using namespace comm::testing;

namespace {

constexpr size_t kHuge = 1048579;
const size_t kCounts[] = {0, 1, 7, 1023, kHuge};

const comm_dtype_t kDtypes[] = {COMM_FLOAT32, COMM_FLOAT64, COMM_FLOAT16, COMM_BFLOAT16, COMM_INT8,
                                COMM_UINT8,   COMM_INT32,   COMM_UINT32,  COMM_INT64,    COMM_UINT64};
const comm_op_t kOps[] = {COMM_SUM, COMM_PROD, COMM_MIN, COMM_MAX, COMM_AVG};

struct AlgoSpec {
  CollKind kind;
  const char* name;
};
const AlgoSpec kAlgorithms[] = {
    {CollKind::kAllreduce, "ring"},
    {CollKind::kAllreduce, "recursive_doubling"},
    {CollKind::kBroadcast, "pipelined_chain"},
    {CollKind::kBroadcast, "binomial_tree"},
    {CollKind::kReduce, "ring"},
    {CollKind::kReduce, "binomial_tree"},
    {CollKind::kAllgather, "ring"},
    {CollKind::kAllgather, "recursive_doubling"},
    {CollKind::kReduceScatter, "ring"},
    {CollKind::kAlltoall, "pairwise"},
};

// The huge count runs for every dtype only where the brief needs it (allreduce sum); elsewhere
// for the dtypes that stand for the rest, to keep the sweep near a minute on two cores.
bool huge_ok(CollKind kind, comm_dtype_t dt, comm_op_t op) {
  const bool core = dt == COMM_FLOAT32 || dt == COMM_INT32;
  switch (kind) {
    case CollKind::kAllreduce:
      return op == COMM_SUM || core;
    case CollKind::kReduce:
    case CollKind::kReduceScatter:
      return core && (op == COMM_SUM || op == COMM_AVG);
    default:
      return dt == COMM_FLOAT32;
  }
}

bool power_of_two(int n) { return (n & (n - 1)) == 0; }

void sweep(CollKind kind) {
  for (const auto& spec : kAlgorithms) {
    if (spec.kind != kind) continue;
    for (comm_dtype_t dt : kDtypes)
      for (comm_op_t op : kOps) {
        if (!is_reduction(kind) && op != COMM_SUM) continue;
        for (size_t count : kCounts) {
          if (count == kHuge && !huge_ok(kind, dt, op)) continue;
          for (int n = 1; n <= 5; ++n) {
            std::vector<int> roots = {0};
            if ((kind == CollKind::kBroadcast || kind == CollKind::kReduce) && n > 1) roots.push_back(n - 1);
            for (int root : roots)
              for (bool in_place : {false, true}) {
                Case c;
                c.kind = kind;
                c.algo = spec.name;
                // recursive_doubling allgather says "not me" off powers of two: the ring runs.
                if (kind == CollKind::kAllgather && c.algo == "recursive_doubling" && !power_of_two(n))
                  c.expect_algo = "ring";
                c.dt = dt;
                c.op = op;
                c.count = count;
                c.n = n;
                c.in_place = in_place;
                c.root = root;
                INFO(c.label());
                CHECK(run_case(c) == "");
              }
          }
        }
      }
  }
}

}  // namespace

TEST_CASE("allreduce: every algorithm, dtype, op and count matches the reference, bitwise identical on all ranks",
          "[algorithms]") {
  sweep(CollKind::kAllreduce);
}

TEST_CASE("reduce: the root holds the reference result; non-root recvbuf may be NULL", "[algorithms]") {
  sweep(CollKind::kReduce);
}

TEST_CASE("broadcast: every rank ends with the root's buffer", "[algorithms]") { sweep(CollKind::kBroadcast); }

TEST_CASE("allgather: block i of every rank's recvbuf is rank i's sendbuf", "[algorithms]") {
  sweep(CollKind::kAllgather);
}

TEST_CASE("reduce_scatter: rank r holds the reduction of block r", "[algorithms]") { sweep(CollKind::kReduceScatter); }

TEST_CASE("alltoall: block j of rank i's sendbuf lands in block i of rank j", "[algorithms]") {
  sweep(CollKind::kAlltoall);
}

TEST_CASE("pipelining: many chunks, short and empty last chunks, chunk_bytes below one element", "[algorithms]") {
  // (chunk_bytes, count): one-element chunks only on the small count, each chunk a message.
  const std::pair<size_t, size_t> shapes[] = {{1, 7}, {8, 7}, {8, 1023}, {24, 1023}, {1000, 1023}};
  for (const auto& spec : kAlgorithms)
    for (comm_dtype_t dt : {COMM_FLOAT32, COMM_FLOAT16, COMM_INT64})
      for (const auto& [chunk, count] : shapes)
        for (int n : {2, 3, 5})
          for (bool in_place : {false, true}) {
            Case c;
            c.kind = spec.kind;
            c.algo = spec.name;
            if (spec.kind == CollKind::kAllgather && c.algo == "recursive_doubling" && !power_of_two(n))
              c.expect_algo = "ring";
            c.dt = dt;
            c.op = is_reduction(spec.kind) ? COMM_AVG : COMM_SUM;
            c.count = count;
            c.n = n;
            c.in_place = in_place;
            c.root = n / 2;
            c.chunk = chunk;
            INFO(c.label());
            CHECK(run_case(c) == "");
          }
}

TEST_CASE("default choice: latency algorithms for small messages, ring and chain for large", "[algorithms]") {
  struct Want {
    CollKind kind;
    size_t count;
    int n;
    const char* algo;
  };
  const Want wants[] = {
      {CollKind::kAllreduce, 7, 5, "recursive_doubling"},
      {CollKind::kAllreduce, kHuge, 5, "ring"},
      {CollKind::kBroadcast, 7, 3, "binomial_tree"},
      {CollKind::kBroadcast, kHuge, 3, "pipelined_chain"},
      {CollKind::kReduce, 7, 3, "binomial_tree"},
      {CollKind::kReduce, kHuge, 3, "ring"},
      {CollKind::kAllgather, 7, 4, "recursive_doubling"},
      {CollKind::kAllgather, 7, 3, "ring"},
      {CollKind::kAllgather, kHuge, 4, "ring"},
      {CollKind::kReduceScatter, 7, 3, "ring"},
      {CollKind::kAlltoall, 7, 3, "pairwise"},
  };
  if (std::getenv("COMM_SMALL_MSG_BYTES") != nullptr) return;  // the thresholds below assume the default
  for (const auto& w : wants) {
    Case c;
    c.kind = w.kind;
    c.expect_algo = w.algo;
    c.count = w.count;
    c.n = w.n;
    INFO(c.label());
    CHECK(run_case(c) == "");
  }
}

namespace {

// select() alone, for one rank of an n-rank world (no traffic).
Status select_for(CollKind kind, int n, size_t count, const std::string& forced, const Algorithm** out) {
  auto fabric = std::make_shared<comm::testing::InprocFabric>(n);
  comm::transport::Options opts;
  opts.rank = 0;
  opts.size = n;
  comm::testing::InprocTransport t(fabric, opts);
  Context ctx{t, 0, n, rank_scratch(0), kDefaultChunk};
  CollArgs a;
  a.kind = kind;
  a.count = count;
  a.peer = 1;
  a.tag.coll = kind;
  return comm::algo::select(ctx, a, forced, out);
}

}  // namespace

TEST_CASE("select: a forced name runs that algorithm; one that cannot run falls back", "[algorithms]") {
  for (const auto& spec : kAlgorithms) {
    const Algorithm* a = nullptr;
    INFO(spec.name);
    REQUIRE(select_for(spec.kind, 4, 7, spec.name, &a).ok());
    CHECK(std::string(a->name) == spec.name);
    CHECK(a->kind == spec.kind);
  }
  const Algorithm* a = nullptr;
  // recursive_doubling allgather needs a power of two: on 3 ranks the ring runs.
  REQUIRE(select_for(CollKind::kAllgather, 3, 7, "recursive_doubling", &a).ok());
  CHECK(std::string(a->name) == "ring");
  // A name of another collective leaves this one to the default choice.
  REQUIRE(select_for(CollKind::kBarrier, 3, 0, "ring", &a).ok());
  CHECK(std::string(a->name) == "dissemination");
  REQUIRE(select_for(CollKind::kSendRecv, 3, 7, "pairwise", &a).ok());
  CHECK(std::string(a->name) == "direct");
  // Every registered algorithm is reachable by name and says which collective it is for (those
  // that need shared memory, which this in-process transport lacks: in test_shm_algorithms.cc).
  for (const auto& alg : comm::algo::registry()) {
    const std::string name = alg.name;
    if (name.rfind("shm_", 0) == 0 || name == "hierarchical") continue;
    REQUIRE(select_for(alg.kind, 4, 7, alg.name, &a).ok());
    CHECK(a == &alg);
  }
}

TEST_CASE("select: an unknown forced name is INVALID_ARGUMENT listing the known names", "[algorithms]") {
  const Algorithm* a = nullptr;
  Status st = select_for(CollKind::kAllreduce, 2, 7, "ringg", &a);
  CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
  for (const char* name : {"ringg", "ring", "recursive_doubling", "pipelined_chain", "binomial_tree", "pairwise",
                           "dissemination", "direct"})
    CHECK(st.message().find(name) != std::string::npos);
  CHECK(a == nullptr);
}

TEST_CASE("barrier: no rank leaves before every rank has arrived", "[algorithms]") {
  constexpr int kRounds = 12;
  for (int n = 1; n <= 5; ++n) {
    std::atomic<int> arrived[kRounds];
    for (auto& x : arrived) x = 0;
    std::atomic<int> early{0};
    RunResult res = run_ranks(n, kDefaultChunk, kTimeoutMs, [&](Context& ctx, RunResult&) {
      for (int round = 0; round < kRounds; ++round) {
        // Late arrivers vary from round to round.
        if ((ctx.rank + round) % n == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        arrived[round].fetch_add(1);
        CollArgs a;
        a.kind = CollKind::kBarrier;
        a.tag.seq = static_cast<uint64_t>(round);
        a.tag.coll = CollKind::kBarrier;
        COMM_RETURN_IF_ERROR(comm::algo::run_collective(ctx, a, ""));
        if (arrived[round].load() != n) early.fetch_add(1);
      }
      return Status::Ok();
    });
    INFO("ranks=" << n);
    for (const auto& st : res.status) CHECK(st.message() == "");
    CHECK(early.load() == 0);
    CHECK(res.leftover == 0);
  }
}

TEST_CASE("send/recv: the rank with sendbuf sends to peer, the other receives", "[algorithms]") {
  for (comm_dtype_t dt : kDtypes)
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}})
      for (int n = 2; n <= 5; ++n) {
        const size_t bytes = count * esize(dt);
        std::vector<std::vector<char>> buf(n);
        for (int r = 0; r < n; ++r) buf[r].assign(bytes, static_cast<char>(r + 1));
        // Even ranks send to the next odd rank; with odd n the last rank sits out.
        RunResult res = run_ranks(n, kDefaultChunk, kTimeoutMs, [&](Context& ctx, RunResult&) {
          const int r = ctx.rank;
          const int peer = r % 2 == 0 ? r + 1 : r - 1;
          if (peer >= n) return Status::Ok();
          CollArgs a;
          a.kind = CollKind::kSendRecv;
          a.count = count;
          a.dtype = dt;
          a.peer = peer;
          if (r % 2 == 0)
            a.sendbuf = count ? buf[r].data() : nullptr;
          else
            a.recvbuf = count ? buf[r].data() : nullptr;
          a.tag.coll = CollKind::kSendRecv;
          a.tag.count = count;
          return comm::algo::run_collective(ctx, a, "");
        });
        INFO(comm::dtype_name(dt) << " count=" << count << " ranks=" << n);
        for (const auto& st : res.status) CHECK(st.message() == "");
        CHECK(res.leftover == 0);
        for (int r = 1; r < n; r += 2) CHECK(buf[r] == std::vector<char>(bytes, static_cast<char>(r)));
      }
}

TEST_CASE("ranks that disagree on a collective get INVALID_USAGE naming both, not a hang", "[algorithms]") {
  RunResult res = run_ranks(2, kDefaultChunk, 2000, [&](Context& ctx, RunResult&) {
    std::vector<float> v(7, 1.0f);
    CollArgs a;
    a.sendbuf = a.recvbuf = v.data();
    a.count = 7;
    a.tag.seq = 5;
    a.tag.coll = CollKind::kAllreduce;
    a.tag.count = ctx.rank == 0 ? 7 : 8;  // rank 1 thinks it is another call
    return comm::algo::run_collective(ctx, a, "ring");
  });
  for (const auto& st : res.status) {
    CHECK(st.code() == COMM_ERR_INVALID_USAGE);
    CHECK(st.message().find('7') != std::string::npos);
    CHECK(st.message().find('8') != std::string::npos);
  }
}

TEST_CASE("a rank whose peer never comes fails with TIMEOUT", "[algorithms]") {
  const auto start = std::chrono::steady_clock::now();
  RunResult res = run_ranks(2, kDefaultChunk, 200, [&](Context& ctx, RunResult&) {
    if (ctx.rank == 1) return Status::Ok();
    std::vector<float> v(7, 1.0f);
    CollArgs a;
    a.sendbuf = a.recvbuf = v.data();
    a.count = 7;
    a.tag.coll = CollKind::kAllreduce;
    a.tag.count = 7;
    return comm::algo::run_collective(ctx, a, "recursive_doubling");
  });
  CHECK(res.status[0].code() == COMM_ERR_TIMEOUT);
  CHECK(res.status[1].ok());
  // The 200 ms timeout ended it, not a hang (the margin is a busy host's: tests/support/loaded_host.h).
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(200 + loaded_host::kSlackMs));
}

TEST_CASE("scratch: 64-byte aligned, at least 64 KiB, grown by powers of two, reused", "[algorithms]") {
  comm::algo::Scratch s;
  void* a = s.get(1, 0);
  REQUIRE(a != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(a) % 64 == 0);
  CHECK(s.get(64 << 10, 0) == a);  // the minimum size class already covers 64 KiB
  void* b = s.get(100000, 0);
  REQUIRE(b != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(b) % 64 == 0);
  std::memset(b, 1, 131072);  // grown to the next power of two (128 KiB)
  CHECK(s.get(131072, 0) == b);
  CHECK(s.get(10, 0) == b);
  void* c = s.get(10, 1);
  CHECK(c != nullptr);
  CHECK(c != b);
  CHECK(s.get(10, 4) == nullptr);
  CHECK(s.get(10, -1) == nullptr);
}

TEST_CASE("ring: sends whose data is final go out ahead of the receives (COMM_RING_SENDS, default 8)",
          "[algorithms]") {
  // A rank that only ever had the chunk it was working on queued left a loaded host's link idle
  // whenever it waited for a CPU slice (docs/benchmarks.md, sockets under load). Here each block
  // is 16 chunks: the first step's sends are all final at once, so up to 8 are in flight before
  // the first receive completes; the old window of 2 sends and 2 receives never passed 4.
  const int n = 3;
  const size_t chunk = 4096, count = size_t{16} * chunk / 4 * n;
  std::vector<std::vector<float>> buf(n, std::vector<float>(count));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) buf[static_cast<size_t>(r)][i] = static_cast<float>((i + static_cast<size_t>(r)) % 7);
  RunResult res = run_ranks(n, chunk, kTimeoutMs, [&](Context& ctx, RunResult&) {
    CollArgs a;
    a.kind = CollKind::kAllreduce;
    a.sendbuf = buf[static_cast<size_t>(ctx.rank)].data();
    a.recvbuf = buf[static_cast<size_t>(ctx.rank)].data();
    a.count = count;
    a.dtype = COMM_FLOAT32;
    a.op = COMM_SUM;
    a.tag.coll = CollKind::kAllreduce;
    return comm::algo::run_collective(ctx, a, "ring");
  });
  for (const auto& st : res.status) CHECK(st.message() == "");
  CHECK(res.peak_requests > 4);
  CHECK(res.peak_requests <= kMaxRequestsInFlight);
  CHECK(res.leftover == 0);
  for (size_t i = 0; i < count; ++i) {
    const float want = static_cast<float>(i % 7 + (i + 1) % 7 + (i + 2) % 7);
    if (buf[0][i] != want || buf[1][i] != want || buf[2][i] != want) {
      FAIL("element " << i << ": " << buf[0][i] << " " << buf[1][i] << " " << buf[2][i] << ", want " << want);
    }
  }
}

TEST_CASE("large buffers: 64 MiB per rank through the ring allreduce", "[algorithms]") {
  Case c;
  c.kind = CollKind::kAllreduce;
  c.algo = "ring";
  c.dt = COMM_FLOAT32;
  c.count = (size_t{64} << 20) / 4;
  c.n = 3;
  INFO(c.label());
  CHECK(run_case(c) == "");
}

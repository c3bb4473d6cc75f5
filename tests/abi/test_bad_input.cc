// Validate at the edge: bad input is COMM_ERR_INVALID_ARGUMENT with a message naming the
// problem, found locally before anything moves, and the communicator stays usable.
#include <cstdint>
#include <cstring>

#include <catch2/catch.hpp>

#include "harness.h"
#include "probe.h"

namespace {

using namespace abi;

constexpr comm_status_t kInvalid = COMM_ERR_INVALID_ARGUMENT;
const auto kDtype99 = static_cast<comm_dtype_t>(99);
const auto kOp99 = static_cast<comm_op_t>(99);
const Words kNullSend = {{"sendbuf", "send buffer"}, {"null"}};
const Words kNullRecv = {{"recvbuf", "recv buffer", "receive buffer"}, {"null"}};
const Words kNullBuf = {{"buf"}, {"null"}};
const Words kCount = {{"count"}};
const Words kDtype = {{"dtype", "datatype", "data type"}, {"99"}};
const Words kOp = {{"op"}, {"99"}};

// Every bad call the contract names, on one rank of a 2-rank communicator. Both ranks make
// the same calls (dup and split with a NULL out-pointer are collective in name only: they
// must fail before any traffic).
Probes bad_calls(comm_t c, int rank) {
  Probes p;
  const int n = 2, peer = 1 - rank;
  float a[64] = {}, b[128] = {};
  const size_t huge = SIZE_MAX / 2;

  // NULL buffers with count > 0.
  p.run("allreduce NULL sendbuf", kInvalid, {{"sendbuf", "send buffer"}, {"null"}, {"allreduce"}}, c,
        [&] { return comm_allreduce(c, nullptr, b, 4, COMM_FLOAT32, COMM_SUM, nullptr); });
  p.run("allreduce NULL recvbuf", kInvalid, kNullRecv, c,
        [&] { return comm_allreduce(c, a, nullptr, 4, COMM_FLOAT32, COMM_SUM, nullptr); });
  p.run("broadcast NULL sendbuf at the root", kInvalid, kNullSend, c,
        [&] { return comm_broadcast(c, nullptr, b, 4, COMM_FLOAT32, rank, nullptr); });
  p.run("broadcast NULL recvbuf", kInvalid, kNullRecv, c,
        [&] { return comm_broadcast(c, a, nullptr, 4, COMM_FLOAT32, rank, nullptr); });
  p.run("reduce NULL sendbuf", kInvalid, kNullSend, c,
        [&] { return comm_reduce(c, nullptr, b, 4, COMM_FLOAT32, COMM_SUM, rank, nullptr); });
  p.run("reduce NULL recvbuf at the root", kInvalid, kNullRecv, c,
        [&] { return comm_reduce(c, a, nullptr, 4, COMM_FLOAT32, COMM_SUM, rank, nullptr); });
  p.run("allgather NULL sendbuf", kInvalid, kNullSend, c,
        [&] { return comm_allgather(c, nullptr, b, 4, COMM_FLOAT32, nullptr); });
  p.run("allgather NULL recvbuf", kInvalid, kNullRecv, c,
        [&] { return comm_allgather(c, a, nullptr, 4, COMM_FLOAT32, nullptr); });
  p.run("reduce_scatter NULL sendbuf", kInvalid, kNullSend, c,
        [&] { return comm_reduce_scatter(c, nullptr, b, 4, COMM_FLOAT32, COMM_SUM, nullptr); });
  p.run("reduce_scatter NULL recvbuf", kInvalid, kNullRecv, c,
        [&] { return comm_reduce_scatter(c, a, nullptr, 4, COMM_FLOAT32, COMM_SUM, nullptr); });
  p.run("alltoall NULL sendbuf", kInvalid, kNullSend, c,
        [&] { return comm_alltoall(c, nullptr, b, 4, COMM_FLOAT32, nullptr); });
  p.run("alltoall NULL recvbuf", kInvalid, kNullRecv, c,
        [&] { return comm_alltoall(c, a, nullptr, 4, COMM_FLOAT32, nullptr); });
  p.run("send NULL buf", kInvalid, kNullBuf, c, [&] { return comm_send(c, nullptr, 4, COMM_FLOAT32, peer, nullptr); });
  p.run("recv NULL buf", kInvalid, kNullBuf, c, [&] { return comm_recv(c, nullptr, 4, COMM_FLOAT32, peer, nullptr); });
  p.run("iallreduce NULL sendbuf", kInvalid, kNullSend, c, [&] {
    comm_request_t req = nullptr;
    return comm_iallreduce(c, nullptr, b, 4, COMM_FLOAT32, COMM_SUM, &req);
  });

  // Counts whose byte size overflows size_t.
  p.run("allreduce count SIZE_MAX/2 float32", kInvalid, kCount, c,
        [&] { return comm_allreduce(c, a, b, huge, COMM_FLOAT32, COMM_SUM, nullptr); });
  p.run("broadcast count SIZE_MAX/2 float64", kInvalid, kCount, c,
        [&] { return comm_broadcast(c, a, b, huge, COMM_FLOAT64, 0, nullptr); });
  p.run("reduce count SIZE_MAX/2 int32", kInvalid, kCount, c,
        [&] { return comm_reduce(c, a, b, huge, COMM_INT32, COMM_SUM, 0, nullptr); });
  p.run("allgather sendcount SIZE_MAX/4 float16 (x 2 ranks x 2 bytes)", kInvalid, kCount, c,
        [&] { return comm_allgather(c, a, b, SIZE_MAX / 4, COMM_FLOAT16, nullptr); });
  p.run("reduce_scatter recvcount SIZE_MAX/4 bfloat16", kInvalid, kCount, c,
        [&] { return comm_reduce_scatter(c, a, b, SIZE_MAX / 4, COMM_BFLOAT16, COMM_SUM, nullptr); });
  p.run("alltoall count SIZE_MAX/2 uint32", kInvalid, kCount, c,
        [&] { return comm_alltoall(c, a, b, huge, COMM_UINT32, nullptr); });
  p.run("send count SIZE_MAX/2 int64", kInvalid, kCount, c,
        [&] { return comm_send(c, a, huge, COMM_INT64, peer, nullptr); });

  // Unknown dtype and op.
  p.run("allreduce dtype 99", kInvalid, kDtype, c, [&] { return comm_allreduce(c, a, b, 4, kDtype99, COMM_SUM, nullptr); });
  p.run("broadcast dtype 99", kInvalid, kDtype, c, [&] { return comm_broadcast(c, a, b, 4, kDtype99, 0, nullptr); });
  p.run("allgather dtype 99", kInvalid, kDtype, c, [&] { return comm_allgather(c, a, b, 4, kDtype99, nullptr); });
  p.run("send dtype 99", kInvalid, kDtype, c, [&] { return comm_send(c, a, 4, kDtype99, peer, nullptr); });
  p.run("allreduce op 99", kInvalid, kOp, c, [&] { return comm_allreduce(c, a, b, 4, COMM_FLOAT32, kOp99, nullptr); });
  p.run("reduce op 99", kInvalid, kOp, c, [&] { return comm_reduce(c, a, b, 4, COMM_FLOAT32, kOp99, 0, nullptr); });
  p.run("reduce_scatter op 99", kInvalid, kOp, c,
        [&] { return comm_reduce_scatter(c, a, b, 4, COMM_FLOAT32, kOp99, nullptr); });
  p.run("allreduce dtype 99 with count 0", kInvalid, kDtype, c,
        [&] { return comm_allreduce(c, nullptr, nullptr, 0, kDtype99, COMM_SUM, nullptr); });

  // Roots and peers out of range.
  p.run("broadcast root -1", kInvalid, {{"root"}, {"-1"}}, c,
        [&] { return comm_broadcast(c, a, b, 4, COMM_FLOAT32, -1, nullptr); });
  p.run("broadcast root == size", kInvalid, {{"root"}, {std::to_string(n)}}, c,
        [&] { return comm_broadcast(c, a, b, 4, COMM_FLOAT32, n, nullptr); });
  p.run("reduce root -1", kInvalid, {{"root"}, {"-1"}}, c,
        [&] { return comm_reduce(c, a, b, 4, COMM_FLOAT32, COMM_SUM, -1, nullptr); });
  p.run("reduce root == size", kInvalid, {{"root"}, {std::to_string(n)}}, c,
        [&] { return comm_reduce(c, a, b, 4, COMM_FLOAT32, COMM_SUM, n, nullptr); });
  p.run("ibroadcast root == size", kInvalid, {{"root"}}, c, [&] {
    comm_request_t req = nullptr;
    return comm_ibroadcast(c, a, b, 4, COMM_FLOAT32, n, &req);
  });
  p.run("send peer == size", kInvalid, {{"peer"}, {std::to_string(n)}}, c,
        [&] { return comm_send(c, a, 4, COMM_FLOAT32, n, nullptr); });
  p.run("send peer -1", kInvalid, {{"peer"}, {"-1"}}, c, [&] { return comm_send(c, a, 4, COMM_FLOAT32, -1, nullptr); });
  p.run("recv peer == size", kInvalid, {{"peer"}, {std::to_string(n)}}, c,
        [&] { return comm_recv(c, a, 4, COMM_FLOAT32, n, nullptr); });
  p.run("irecv peer -7", kInvalid, {{"peer"}, {"-7"}}, c, [&] {
    comm_request_t req = nullptr;
    return comm_irecv(c, a, 4, COMM_FLOAT32, -7, &req);
  });

  // NULL out-pointers.
  p.run("comm_rank NULL out", kInvalid, {{"rank"}}, c, [&] { return comm_rank(c, nullptr); });
  p.run("comm_size NULL out", kInvalid, {{"size"}}, c, [&] { return comm_size(c, nullptr); });
  p.run("comm_dup NULL out", kInvalid, {{"out", "null"}}, c, [&] { return comm_dup(c, nullptr); });
  p.run("comm_split NULL out", kInvalid, {{"out", "null"}}, c, [&] { return comm_split(c, 0, 0, nullptr); });
  p.run("iallreduce NULL request", kInvalid, {{"req", "request"}}, c,
        [&] { return comm_iallreduce(c, a, b, 4, COMM_FLOAT32, COMM_SUM, nullptr); });
  p.run("ibarrier NULL request", kInvalid, {{"req", "request"}}, c, [&] { return comm_ibarrier(c, nullptr); });
  p.run("isend NULL request", kInvalid, {{"req", "request"}}, c,
        [&] { return comm_isend(c, a, 4, COMM_FLOAT32, peer, nullptr); });
  p.run("comm_wait(NULL)", kInvalid, {{"req", "request"}}, nullptr, [&] { return comm_wait(nullptr); });
  p.run("comm_test(NULL, &done)", kInvalid, {{"req", "request"}}, nullptr, [&] {
    int done = 0;
    return comm_test(nullptr, &done);
  });
  p.run("comm_mem_alloc NULL out", kInvalid, {{"ptr", "out", "null"}}, c, [&] { return comm_mem_alloc(c, 64, nullptr); });
  p.run("comm_get_version(NULL, NULL)", kInvalid, {{"null", "major"}}, nullptr,
        [&] { return comm_get_version(nullptr, nullptr); });

  // NULL communicator: the message comes from comm_last_error(NULL).
  p.run("allreduce on a NULL comm", kInvalid, {{"comm"}}, nullptr,
        [&] { return comm_allreduce(nullptr, a, b, 4, COMM_FLOAT32, COMM_SUM, nullptr); });
  p.run("barrier on a NULL comm", kInvalid, {{"comm"}}, nullptr, [&] { return comm_barrier(nullptr, nullptr); });
  p.run("send on a NULL comm", kInvalid, {{"comm"}}, nullptr,
        [&] { return comm_send(nullptr, a, 4, COMM_FLOAT32, 0, nullptr); });
  p.run("iallreduce on a NULL comm", kInvalid, {{"comm"}}, nullptr, [&] {
    comm_request_t req = nullptr;
    return comm_iallreduce(nullptr, a, b, 4, COMM_FLOAT32, COMM_SUM, &req);
  });
  p.run("comm_rank on a NULL comm", kInvalid, {{"comm"}}, nullptr, [&] {
    int r = 0;
    return comm_rank(nullptr, &r);
  });
  p.run("comm_size on a NULL comm", kInvalid, {{"comm"}}, nullptr, [&] {
    int s = 0;
    return comm_size(nullptr, &s);
  });
  p.run("comm_dup of a NULL comm", kInvalid, {{"comm"}}, nullptr, [&] {
    comm_t out = nullptr;
    return comm_dup(nullptr, &out);
  });
  p.run("comm_split of a NULL comm", kInvalid, {{"comm"}}, nullptr, [&] {
    comm_t out = nullptr;
    return comm_split(nullptr, 0, 0, &out);
  });
  p.run("comm_abort(NULL)", kInvalid, {{"comm"}}, nullptr, [&] { return comm_abort(nullptr); });
  p.run("comm_destroy(NULL)", kInvalid, {{"comm"}}, nullptr, [&] { return comm_destroy(nullptr); });
  p.run("comm_get_async_error(NULL)", kInvalid, {}, nullptr, [&] { return comm_get_async_error(nullptr); });
  return p;
}

// count == 0 moves nothing; buffers may then be NULL. Every rank makes the same calls.
Probes zero_count_calls(comm_t c, int rank) {
  Probes p;
  const int peer = 1 - rank;
  p.run("allreduce count 0, NULL buffers", COMM_OK, {}, c,
        [&] { return comm_allreduce(c, nullptr, nullptr, 0, COMM_FLOAT32, COMM_SUM, nullptr); });
  p.run("broadcast count 0, NULL buffers", COMM_OK, {}, c,
        [&] { return comm_broadcast(c, nullptr, nullptr, 0, COMM_INT8, 1, nullptr); });
  p.run("reduce count 0, NULL buffers", COMM_OK, {}, c,
        [&] { return comm_reduce(c, nullptr, nullptr, 0, COMM_FLOAT16, COMM_MAX, 0, nullptr); });
  p.run("allgather count 0, NULL buffers", COMM_OK, {}, c,
        [&] { return comm_allgather(c, nullptr, nullptr, 0, COMM_UINT64, nullptr); });
  p.run("reduce_scatter count 0, NULL buffers", COMM_OK, {}, c,
        [&] { return comm_reduce_scatter(c, nullptr, nullptr, 0, COMM_BFLOAT16, COMM_AVG, nullptr); });
  p.run("alltoall count 0, NULL buffers", COMM_OK, {}, c,
        [&] { return comm_alltoall(c, nullptr, nullptr, 0, COMM_INT32, nullptr); });
  p.run("grouped send/recv count 0, NULL buffers", COMM_OK, {}, c, [&] {
    comm_status_t st = comm_group_start();
    const comm_status_t s1 = comm_send(c, nullptr, 0, COMM_FLOAT64, peer, nullptr);
    const comm_status_t s2 = comm_recv(c, nullptr, 0, COMM_FLOAT64, peer, nullptr);
    const comm_status_t s3 = comm_group_end();
    for (comm_status_t s : {s1, s2, s3}) {
      if (st == COMM_OK) st = s;
    }
    return st;
  });
  p.run("iallreduce count 0, NULL buffers, then wait", COMM_OK, {}, c, [&] {
    comm_request_t req = nullptr;
    const comm_status_t st = comm_iallreduce(c, nullptr, nullptr, 0, COMM_INT64, COMM_PROD, &req);
    return st == COMM_OK ? comm_wait(req) : st;
  });
  return p;
}

// The communicator still works after all that: a real all-reduce.
Probes still_usable(comm_t c, int rank) {
  Probes p;
  p.run("allreduce afterwards", COMM_OK, {}, c, [&] {
    int32_t x[3] = {rank + 1, 10 * (rank + 1), -rank};
    int32_t y[3] = {};
    const comm_status_t st = comm_allreduce(c, x, y, 3, COMM_INT32, COMM_SUM, nullptr);
    if (st == COMM_OK && !(y[0] == 3 && y[1] == 30 && y[2] == -1)) return COMM_ERR_INTERNAL;  // wrong values
    return st;
  });
  p.run("comm_get_async_error afterwards", COMM_OK, {}, c, [&] { return comm_get_async_error(c); });
  return p;
}

}  // namespace

TEST_CASE("bad arguments are COMM_ERR_INVALID_ARGUMENT naming the problem, and the communicator stays usable",
          "[bad_input]") {
  Ranks ranks = init_ranks(2, "bad-input", 20000);
  REQUIRE(ranks.all_ok());
  auto per_rank = on_ranks(2, [&](int r) {
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    Probes all = bad_calls(c, r);
    for (auto* more : {&zero_count_calls, &still_usable}) {
      Probes p = (*more)(c, r);
      all.list.insert(all.list.end(), p.list.begin(), p.list.end());
    }
    return all;
  });
  destroy_ranks(ranks.comms);
  check_probes(per_rank);
}

TEST_CASE("non-root NULL buffers are ignored: broadcast's sendbuf and reduce's recvbuf", "[bad_input]") {
  Ranks ranks = init_ranks(3, "null-nonroot", 20000);
  REQUIRE(ranks.all_ok());
  struct Got {
    comm_status_t bcast, reduce;
    std::string message;
    double bvals[4];
    double rvals[4];
  };
  auto got = on_ranks(3, [&](int r) {
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    Got g{};
    double src[4] = {1.5, -2, 3, 1e10};
    for (double& v : g.bvals) v = -1;
    g.bcast = comm_broadcast(c, r == 1 ? src : nullptr, g.bvals, 4, COMM_FLOAT64, 1, nullptr);
    double mine[4] = {double(r), double(r * r), 1, -double(r)};
    g.reduce = comm_reduce(c, mine, r == 2 ? g.rvals : nullptr, 4, COMM_FLOAT64, COMM_SUM, 2, nullptr);
    if (g.bcast != COMM_OK || g.reduce != COMM_OK) g.message = last_error(c);
    return g;
  });
  destroy_ranks(ranks.comms);
  const double root_data[4] = {1.5, -2, 3, 1e10};
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": broadcast " << status_name(got[r].bcast) << ", reduce " << status_name(got[r].reduce)
                 << " " << got[r].message);
    CHECK(got[r].bcast == COMM_OK);
    CHECK(got[r].reduce == COMM_OK);
    CHECK(std::memcmp(got[r].bvals, root_data, sizeof root_data) == 0);
  }
  CHECK(got[2].rvals[0] == 3);
  CHECK(got[2].rvals[1] == 5);
  CHECK(got[2].rvals[2] == 3);
  CHECK(got[2].rvals[3] == -3);
}

TEST_CASE("comm_last_error(NULL) after a failed comm_init says why", "[bad_input]") {
  struct Bad {
    const char* what;
    std::function<void(comm_config_t&)> spoil;
    Words words;
  };
  const std::string method = unique_init_method("bad-init");
  const std::vector<Bad> bads = {
      {"rank 5 of 2", [](comm_config_t& c) { c.rank = 5; }, {{"rank"}, {"5"}}},
      {"rank -3", [](comm_config_t& c) { c.rank = -3; }, {{"rank"}, {"-3"}}},
      {"world_size 0", [](comm_config_t& c) { c.world_size = 0; c.rank = 0; }, {{"world", "size"}, {"0"}}},
      {"init_method bogus://x", [](comm_config_t& c) { c.init_method = "bogus://x"; }, {{"bogus"}}},
      {"timeout_ms -5", [](comm_config_t& c) { c.timeout_ms = -5; }, {{"timeout"}, {"-5"}}},
      {"config size 3", [](comm_config_t& c) { c.size = 3; }, {{"size"}}},
  };
  for (const Bad& bad : bads) {
    comm_config_t cfg = make_config(method, 0, 2, 2000);
    bad.spoil(cfg);
    comm_t c = nullptr;
    const Outcome o = timed(nullptr, [&] { return comm_init(&cfg, &c); });
    if (o.status == COMM_OK) comm_destroy(c);
    Probe p{std::string("comm_init with ") + bad.what, COMM_ERR_INVALID_ARGUMENT, bad.words, o};
    check_probe(p, "1 thread");
  }
  // A NULL out-pointer is refused (a NULL config may mean "all defaults": not asserted).
  comm_config_t cfg = make_config(method, 0, 1, 2000);
  comm_t c = nullptr;
  check_probe({"comm_init(&cfg, NULL)", COMM_ERR_INVALID_ARGUMENT, {{"comm", "out", "null"}}, timed(nullptr, [&] {
                 return comm_init(&cfg, nullptr);
               })},
              "1 thread");
  // An unknown transport is refused by name (whatever status says it is missing).
  cfg.transport = "carrier-pigeon";
  const Outcome o = timed(nullptr, [&] { return comm_init(&cfg, &c); });
  if (o.status == COMM_OK) comm_destroy(c);
  INFO("comm_init with transport carrier-pigeon -> " << describe(o));
  CHECK(o.status != COMM_OK);
  CHECK(icontains(o.message, "carrier-pigeon"));
}

// Non-blocking host variants (comm_i* + comm_wait / comm_test), issue order, and NCCL's
// group semantics for sends and receives.
#include <atomic>
#include <cstring>
#include <latch>
#include <thread>

#include <catch2/catch.hpp>

#include "harness.h"
#include "reference.h"

namespace {

using namespace abi;

// Polls comm_test until the request completes (the request is freed then); bounded.
comm_status_t test_until_done(comm_request_t req, double limit_ms = 120000) {
  const double t0 = now_ms();
  for (;;) {
    int done = -1;
    const comm_status_t st = comm_test(req, &done);
    if (done == 1) return st;
    if (done != 0) return COMM_ERR_INTERNAL;  // comm_test must say 0 or 1
    if (st != COMM_OK) return st;
    if (now_ms() - t0 > limit_ms) return COMM_ERR_TIMEOUT;
    std::this_thread::yield();
  }
}

// Completes by comm_wait or by polling comm_test, alternating, so both paths are used.
comm_status_t complete(comm_request_t req, bool poll) { return poll ? test_until_done(req) : comm_wait(req); }

void report(RankCtx& k, const std::string& what, const CheckResult& res) {
  if (!res.ok()) k.fail(what + ": " + std::to_string(res.wrong) + " wrong, first " + res.first);
}

comm_status_t first_error(std::initializer_list<comm_status_t> all) {
  for (comm_status_t s : all) {
    if (s != COMM_OK) return s;
  }
  return COMM_OK;
}

void nonblocking_body(RankCtx& k) {
  const size_t n = static_cast<size_t>(k.n);
  const int root = k.n - 1;
  struct Variant {
    comm_dtype_t dtype;
    comm_op_t op;
    size_t count;
  };
  const Variant variants[] = {{COMM_FLOAT32, COMM_SUM, 1023},  {COMM_FLOAT16, COMM_AVG, 7},
                              {COMM_INT64, COMM_PROD, 65537},  {COMM_UINT8, COMM_MAX, 0},
                              {COMM_BFLOAT16, COMM_MIN, 4099}, {COMM_INT32, COMM_SUM, kLargeCount}};
  uint64_t seed = 77;
  bool poll = false;
  for (const Variant& v : variants) {
    const size_t es = dtype_size(v.dtype);
    const std::string tag = std::string(" n=") + std::to_string(k.n) + " " + dtype_name(v.dtype) + " " +
                            op_name(v.op) + " count=" + std::to_string(v.count);
    comm_request_t req = nullptr;
    comm_status_t st;

    ++seed;
    poll = !poll;
    fill_input(k.send, v.count, v.dtype, v.op, seed, k.rank, 0);
    st = comm_iallreduce(k.comm, k.send, k.recv, v.count, v.dtype, v.op, &req);
    if (st == COMM_OK) st = complete(req, poll);
    if (!k.settle(st, "iallreduce" + tag, [&] {
          report(k, "iallreduce" + tag, check_reduced(k.recv, v.count, v.dtype, v.op, seed, k.n, 0));
        }))
      return;

    ++seed;
    poll = !poll;
    fill_input(k.send, v.count, v.dtype, v.op, seed, k.rank, 0);
    st = comm_ireduce(k.comm, k.send, k.recv, v.count, v.dtype, v.op, root, &req);
    if (st == COMM_OK) st = complete(req, poll);
    if (!k.settle(st, "ireduce" + tag, [&] {
          if (k.rank == root) report(k, "ireduce" + tag, check_reduced(k.recv, v.count, v.dtype, v.op, seed, k.n, 0));
        }))
      return;

    ++seed;
    poll = !poll;
    fill_input(k.send, v.count, v.dtype, COMM_SUM, seed, k.rank, 0);
    st = comm_ibroadcast(k.comm, k.send, k.recv, v.count, v.dtype, root, &req);
    if (st == COMM_OK) st = complete(req, poll);
    if (!k.settle(st, "ibroadcast" + tag, [&] {
          report(k, "ibroadcast" + tag, check_copied(k.recv, v.count, v.dtype, COMM_SUM, seed, root, 0));
        }))
      return;

    ++seed;
    poll = !poll;
    fill_input(k.send, v.count, v.dtype, COMM_SUM, seed, k.rank, 0);
    st = comm_iallgather(k.comm, k.send, k.recv, v.count, v.dtype, &req);
    if (st == COMM_OK) st = complete(req, poll);
    if (!k.settle(st, "iallgather" + tag, [&] {
          for (int j = 0; j < k.n; ++j) {
            report(k, "iallgather" + tag,
                   check_copied(k.recv + static_cast<size_t>(j) * v.count * es, v.count, v.dtype, COMM_SUM, seed, j, 0));
          }
        }))
      return;

    ++seed;
    poll = !poll;
    fill_input(k.send, n * v.count, v.dtype, v.op, seed, k.rank, 0);
    st = comm_ireduce_scatter(k.comm, k.send, k.recv, v.count, v.dtype, v.op, &req);
    if (st == COMM_OK) st = complete(req, poll);
    if (!k.settle(st, "ireduce_scatter" + tag, [&] {
          report(k, "ireduce_scatter" + tag,
                 check_reduced(k.recv, v.count, v.dtype, v.op, seed, k.n, static_cast<size_t>(k.rank) * v.count));
        }))
      return;

    ++seed;
    poll = !poll;
    fill_input(k.send, n * v.count, v.dtype, COMM_SUM, seed, k.rank, 0);
    st = comm_ialltoall(k.comm, k.send, k.recv, v.count, v.dtype, &req);
    if (st == COMM_OK) st = complete(req, poll);
    if (!k.settle(st, "ialltoall" + tag, [&] {
          for (int j = 0; j < k.n; ++j) {
            report(k, "ialltoall" + tag,
                   check_copied(k.recv + static_cast<size_t>(j) * v.count * es, v.count, v.dtype, COMM_SUM, seed, j,
                                static_cast<size_t>(k.rank) * v.count));
          }
        }))
      return;

    poll = !poll;
    st = comm_ibarrier(k.comm, &req);
    if (st == COMM_OK) st = complete(req, poll);
    if (!k.settle(st, "ibarrier" + tag, [] {})) return;

  }
}

// Twelve collectives of mixed kinds and sizes issued back to back, each on its own region of
// the buffers; then polled last-to-first. When a request reports done, every earlier one is
// asked at once: one still pending completed out of issue order.
void issue_order_body(RankCtx& k) {
  const size_t n = static_cast<size_t>(k.n);
  struct Op {
    int kind;  // 0 allreduce, 1 allgather, 2 broadcast, 3 reduce_scatter
    comm_dtype_t dtype;
    comm_op_t op;
    size_t count;
    size_t send_off = 0, recv_off = 0;  // bytes
    uint64_t seed = 0;
    comm_request_t req = nullptr;
    comm_status_t status = COMM_OK;
    bool done = false;
  };
  std::vector<Op> ops;
  const size_t sizes[] = {262144, 1, 65536, 7, 131072, 1023};
  for (int i = 0; i < 12; ++i) {
    ops.push_back({i % 4, i % 3 == 0 ? COMM_FLOAT32 : (i % 3 == 1 ? COMM_INT32 : COMM_FLOAT64),
                   i % 2 ? COMM_MAX : COMM_SUM, sizes[i % 6]});
  }
  size_t send_off = 0, recv_off = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    Op& o = ops[i];
    const size_t es = dtype_size(o.dtype);
    o.seed = 4000 + i;
    o.send_off = send_off;
    o.recv_off = recv_off;
    const size_t in = (o.kind == 3 ? n : 1) * o.count * es;
    const size_t out = (o.kind == 1 ? n : 1) * o.count * es;
    send_off += (in + 63) / 64 * 64;
    recv_off += (out + 63) / 64 * 64;
    fill_input(k.send + o.send_off, in / es, o.dtype, o.op, o.seed, k.rank, 0);
    std::memset(k.recv + o.recv_off, 0xA5, out);
  }
  comm_status_t issue = COMM_OK;
  for (Op& o : ops) {
    const void* s = k.send + o.send_off;
    void* r = k.recv + o.recv_off;
    comm_status_t st = COMM_OK;
    switch (o.kind) {
      case 0: st = comm_iallreduce(k.comm, s, r, o.count, o.dtype, o.op, &o.req); break;
      case 1: st = comm_iallgather(k.comm, s, r, o.count, o.dtype, &o.req); break;
      case 2: st = comm_ibroadcast(k.comm, s, r, o.count, o.dtype, 0, &o.req); break;
      default: st = comm_ireduce_scatter(k.comm, s, r, o.count, o.dtype, o.op, &o.req); break;
    }
    if (st != COMM_OK) {
      issue = st;
      o.done = true;
      o.status = st;
    }
  }
  std::string order_error;
  const double t0 = now_ms();
  for (;;) {
    size_t pending = 0;
    for (size_t j = ops.size(); j-- > 0;) {
      Op& o = ops[j];
      if (o.done) continue;
      int done = 0;
      const comm_status_t st = comm_test(o.req, &done);
      if (done == 1) {
        o.done = true;
        o.status = st;
        // Every earlier request must be complete by now: ask each at once.
        for (size_t i = 0; i < j; ++i) {
          if (ops[i].done) continue;
          int d = 0;
          const comm_status_t s = comm_test(ops[i].req, &d);
          if (d == 1) {
            ops[i].done = true;
            ops[i].status = s;
          } else if (order_error.empty()) {
            order_error = "request " + std::to_string(j) + " reported done while request " + std::to_string(i) +
                          " (issued earlier) was still pending";
          }
        }
      } else if (st != COMM_OK) {
        o.done = true;
        o.status = st;
      } else {
        ++pending;
      }
    }
    if (pending == 0) break;
    if (now_ms() - t0 > 120000) {
      k.fail("issue order: requests still pending after 120 s");
      break;
    }
    std::this_thread::yield();
  }
  comm_status_t st = issue;
  for (const Op& o : ops) {
    if (st == COMM_OK) st = o.status;
  }
  if (!order_error.empty()) k.fail("issue order n=" + std::to_string(k.n) + ": " + order_error);
  k.settle(st, "issue order n=" + std::to_string(k.n), [&] {
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op& o = ops[i];
      const size_t es = dtype_size(o.dtype);
      const unsigned char* r = k.recv + o.recv_off;
      const std::string what = "issue order n=" + std::to_string(k.n) + " request " + std::to_string(i);
      switch (o.kind) {
        case 0: report(k, what + " allreduce", check_reduced(r, o.count, o.dtype, o.op, o.seed, k.n, 0)); break;
        case 1:
          for (int j = 0; j < k.n; ++j) {
            report(k, what + " allgather",
                   check_copied(r + static_cast<size_t>(j) * o.count * es, o.count, o.dtype, o.op, o.seed, j, 0));
          }
          break;
        case 2: report(k, what + " broadcast", check_copied(r, o.count, o.dtype, o.op, o.seed, 0, 0)); break;
        default:
          report(k, what + " reduce_scatter",
                 check_reduced(r, o.count, o.dtype, o.op, o.seed, k.n, static_cast<size_t>(k.rank) * o.count));
      }
    }
  });
}

// Two in-place all-reduces on one buffer, issued back to back: sum then max gives
// sum_r(x_r); the other order (or both at once) gives something else for n >= 2.
void dependent_chain_body(RankCtx& k) {
  const size_t count = 100000;
  auto* x = reinterpret_cast<double*>(k.recv);
  for (size_t i = 0; i < count; ++i) x[i] = static_cast<double>(k.rank + 1) + static_cast<double>(i);
  comm_request_t a = nullptr, b = nullptr;
  comm_status_t st = comm_iallreduce(k.comm, x, x, count, COMM_FLOAT64, COMM_SUM, &a);
  const comm_status_t s2 = comm_iallreduce(k.comm, x, x, count, COMM_FLOAT64, COMM_MAX, &b);
  const comm_status_t s3 = s2 == COMM_OK ? comm_wait(b) : s2;  // the later one first
  const comm_status_t s4 = st == COMM_OK ? comm_wait(a) : st;
  st = first_error({st, s2, s3, s4});
  k.settle(st, "dependent chain n=" + std::to_string(k.n), [&] {
    const double n = k.n;
    for (size_t i = 0; i < count; ++i) {
      const double expected = n * (n + 1) / 2 + n * static_cast<double>(i);
      if (x[i] != expected) {
        k.fail("dependent chain n=" + std::to_string(k.n) + ": element " + std::to_string(i) + " is " +
               std::to_string(x[i]) + ", expected " + std::to_string(expected) +
               " (sum then max, in issue order)");
        break;
      }
    }
  });
}

// Each rank sends to and receives from both neighbours with blocking calls: without the
// group, every rank would sit in its first send. Receives from one peer match that peer's
// sends to this rank in order (n = 2: both neighbours are the same rank).
void both_neighbours_body(RankCtx& k) {
  const size_t count = size_t{2} << 20;  // 8 MiB of float32 per message: more than a socket buffers
  const comm_dtype_t d = COMM_FLOAT32;
  const size_t bytes = count * dtype_size(d);
  const int left = (k.rank + k.n - 1) % k.n, right = (k.rank + 1) % k.n;
  const uint64_t seed = 99;
  // Send i of rank s carries input(s, i * count + ...).
  fill_input(k.send, 2 * count, d, COMM_SUM, seed, k.rank, 0);
  std::memset(k.recv, 0xA5, 2 * bytes);
  comm_status_t st = comm_group_start();
  const comm_status_t s1 = comm_send(k.comm, k.send, count, d, left, nullptr);
  const comm_status_t s2 = comm_send(k.comm, k.send + bytes, count, d, right, nullptr);
  const comm_status_t s3 = comm_recv(k.comm, k.recv, count, d, left, nullptr);
  const comm_status_t s4 = comm_recv(k.comm, k.recv + bytes, count, d, right, nullptr);
  const comm_status_t s5 = comm_group_end();
  st = first_error({st, s1, s2, s3, s4, s5});
  k.settle(st, "grouped both-neighbour exchange n=" + std::to_string(k.n), [&] {
    const int recv_from[2] = {left, right};
    for (int i = 0; i < 2; ++i) {
      const int peer = recv_from[i];
      // k-th receive from peer <- k-th send of peer to this rank.
      int kth = 0;
      for (int j = 0; j < i; ++j) kth += recv_from[j] == peer;
      const int peer_dest[2] = {(peer + k.n - 1) % k.n, (peer + 1) % k.n};
      int send_index = -1;
      for (int j = 0, seen = 0; j < 2; ++j) {
        if (peer_dest[j] == k.rank && seen++ == kth) send_index = j;
      }
      report(k, "grouped exchange n=" + std::to_string(k.n) + " receive " + std::to_string(i) + " from rank " +
                    std::to_string(peer),
             check_copied(k.recv + static_cast<size_t>(i) * bytes, count, d, COMM_SUM, seed, peer,
                          static_cast<size_t>(send_index) * count));
    }
  });
}

void check_all(const char* label, int from, int to, const std::function<void(RankCtx&)>& body) {
  for (int n = from; n <= to; ++n) {
    const std::string failures = run_on_shared_world(n, body);
    INFO(label << " with " << n << " ranks");
    CHECK(failures == "");
  }
}

}  // namespace

TEST_CASE("non-blocking variants of every collective give the blocking results, by comm_wait and by comm_test",
          "[nonblocking]") {
  check_all("non-blocking", 1, 4, nonblocking_body);
}

TEST_CASE("collectives issued back to back without waiting complete in issue order with correct results",
          "[nonblocking]") {
  check_all("issue order", 1, 4, issue_order_body);
}

TEST_CASE("in-place collectives on one buffer issued back to back act in issue order", "[nonblocking]") {
  check_all("dependent chain", 2, 4, dependent_chain_body);
}

TEST_CASE("a group of blocking sends and receives to both neighbours completes (it would deadlock ungrouped)",
          "[nonblocking]") {
  check_all("grouped exchange", 2, 5, both_neighbours_body);
}

TEST_CASE("comm_test reports 0 while the peer has not sent, and the request stays valid", "[nonblocking]") {
  Ranks ranks = init_ranks(2, "test-pending", 20000);
  REQUIRE(ranks.all_ok());
  std::latch tested(1);
  struct Seen {
    comm_status_t first = COMM_OK;
    int done_before_send = -1;
    comm_status_t final = COMM_ERR_INTERNAL;
    std::string message;
    int value = 0;
  };
  auto seen = on_ranks(2, [&](int r) {
    Seen s;
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    int v = 0;
    if (r == 0) {
      comm_request_t req = nullptr;
      s.first = comm_irecv(c, &v, 1, COMM_INT32, 1, &req);
      if (s.first == COMM_OK) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        s.first = comm_test(req, &s.done_before_send);
        tested.count_down();
        s.final = s.done_before_send == 1 ? s.first : comm_wait(req);
      } else {
        tested.count_down();
      }
    } else {
      tested.wait();
      v = 4242;
      s.final = comm_send(c, &v, 1, COMM_INT32, 0, nullptr);
    }
    if (s.final != COMM_OK) s.message = last_error(c);
    s.value = v;
    return s;
  });
  destroy_ranks(ranks.comms);
  CHECK(seen[0].first == COMM_OK);
  CHECK(seen[0].done_before_send == 0);
  INFO("rank 0: " << status_name(seen[0].final) << " " << seen[0].message);
  INFO("rank 1: " << status_name(seen[1].final) << " " << seen[1].message);
  CHECK(seen[0].final == COMM_OK);
  CHECK(seen[1].final == COMM_OK);
  CHECK(seen[0].value == 4242);
}

TEST_CASE("isend/irecv to both ring neighbours, posted before any wait, complete in either posting order",
          "[nonblocking]") {
  // Own communicators with a short timeout: a deadlock here fails in seconds.
  const size_t count = 1023;
  for (int n = 2; n <= 4; ++n) {
    for (bool recv_first : {true, false}) {
      Ranks ranks = init_ranks(n, "isend-irecv", 5000);
      REQUIRE(ranks.all_ok());
      struct Seen {
        Outcome outcome;
        CheckResult check;
      };
      auto seen = on_ranks(n, [&](int r) {
        Seen s;
        comm_t c = ranks.comms[static_cast<size_t>(r)];
        const int right = (r + 1) % n, left = (r + n - 1) % n;
        std::vector<float> out(count), in(count, -1.0f);
        fill_input(out.data(), count, COMM_FLOAT32, COMM_SUM, 31, r, 0);
        s.outcome = timed(c, [&] {
          comm_request_t rreq = nullptr, sreq = nullptr;
          comm_status_t a, b;
          if (recv_first) {
            a = comm_irecv(c, in.data(), count, COMM_FLOAT32, left, &rreq);
            b = comm_isend(c, out.data(), count, COMM_FLOAT32, right, &sreq);
          } else {
            b = comm_isend(c, out.data(), count, COMM_FLOAT32, right, &sreq);
            a = comm_irecv(c, in.data(), count, COMM_FLOAT32, left, &rreq);
          }
          const comm_status_t wa = a == COMM_OK ? comm_wait(rreq) : a;
          const comm_status_t wb = b == COMM_OK ? comm_wait(sreq) : b;
          return first_error({a, b, wa, wb});
        });
        s.check = check_copied(in.data(), count, COMM_FLOAT32, COMM_SUM, 31, left, 0);
        return s;
      });
      for (auto c : ranks.comms) comm_abort(c);
      destroy_ranks(ranks.comms);
      for (int r = 0; r < n; ++r) {
        INFO(n << " ranks, " << (recv_first ? "irecv posted first" : "isend posted first") << ", rank " << r << ": "
               << describe(seen[r].outcome) << " " << seen[r].check.first);
        CHECK(seen[r].outcome.status == COMM_OK);
        CHECK(seen[r].check.ok());
      }
    }
  }
}

// comm_wait runs a call inline when the worker has not taken it; while that keeps happening the
// worker is not woken per call but looks at its queue every millisecond (libcomm/src/execute.cc,
// kLazyPoll). A call nobody waits for must still run: here it is only polled with comm_test,
// which never runs a call itself.
TEST_CASE("after comm_wait ran calls inline, a collective only polled with comm_test still completes",
          "[nonblocking]") {
  Ranks ranks = init_ranks(2, "lazy-worker", 20000);
  REQUIRE(ranks.all_ok());
  struct Seen {
    comm_status_t st = COMM_ERR_INTERNAL;
    int value = 0;
    double ms = 0;
  };
  auto seen = on_ranks(2, [&](int r) {
    Seen s;
    comm_t c = ranks.comms[static_cast<size_t>(r)];
    int v = 0;
    for (int i = 0; i < 50; ++i) {  // issue, then wait at once: run inline
      v = r + i;
      comm_request_t req = nullptr;
      s.st = comm_iallreduce(c, &v, &v, 1, COMM_INT32, COMM_SUM, &req);
      if (s.st == COMM_OK) s.st = comm_wait(req);
      if (s.st != COMM_OK || v != 2 * i + 1) return s;
    }
    v = 10 + r;
    comm_request_t req = nullptr;
    const double t0 = now_ms();
    s.st = comm_iallreduce(c, &v, &v, 1, COMM_INT32, COMM_SUM, &req);
    if (s.st == COMM_OK) s.st = test_until_done(req, 10000 + loaded_host::kSlackMs);
    s.ms = now_ms() - t0;
    s.value = v;
    return s;
  });
  destroy_ranks(ranks.comms);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << status_name(seen[static_cast<size_t>(r)].st) << " after "
                 << seen[static_cast<size_t>(r)].ms << " ms");
    CHECK(seen[static_cast<size_t>(r)].st == COMM_OK);
    CHECK(seen[static_cast<size_t>(r)].value == 21);
  }
}

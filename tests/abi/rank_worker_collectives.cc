// rank_worker's healthy modes: every collective checked and hashed (collectives, and under
// comm-run), init alone, comm_mem_alloc buffers (shm), small calls under sprayed garbage (garbage).
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "rank_worker.h"
#include "reference.h"

namespace rank_worker {

using namespace abi;

// A cross-section of every collective (each dtype, op, placement at least once, counts
// from 0 to 1048579), checked in full on every rank.
int run_collectives(comm_t c, Checker& k) {
  const int r = k.rank(), n = k.n();
  const size_t un = static_cast<size_t>(n);
  const size_t max_elems = un * kLargeCount;
  std::vector<unsigned char> sendv(max_elems * 8), recvv(max_elems * 8);
  unsigned char* send = sendv.data();
  unsigned char* recv = recvv.data();
  uint64_t seed = 1;

  struct Red {
    comm_dtype_t d;
    comm_op_t op;
    size_t count;
    bool in_place;
  };
  const Red allreduces[] = {{COMM_FLOAT32, COMM_SUM, 1048579, false}, {COMM_FLOAT16, COMM_AVG, 1023, true},
                            {COMM_BFLOAT16, COMM_PROD, 7, false},    {COMM_INT8, COMM_SUM, 1023, true},
                            {COMM_UINT64, COMM_MAX, 65537, false},   {COMM_INT32, COMM_MIN, 1, false},
                            {COMM_FLOAT64, COMM_SUM, 0, false},      {COMM_INT64, COMM_AVG, 1048579, true},
                            {COMM_UINT8, COMM_PROD, 4099, false},    {COMM_UINT32, COMM_SUM, 262147, true}};
  for (const Red& a : allreduces) {
    const std::string what = std::string("allreduce ") + dtype_name(a.d) + " " + op_name(a.op) + " " +
                             std::to_string(a.count) + (a.in_place ? " in-place" : "");
    unsigned char* src = a.in_place ? recv : send;
    fill_input(src, a.count, a.d, a.op, ++seed, r, 0);
    if (!k.status(comm_allreduce(c, src, recv, a.count, a.d, a.op, nullptr), what)) return 1;
    k.result(check_reduced(recv, a.count, a.d, a.op, seed, n, 0), what);
    k.hash(what, recv, a.count * dtype_size(a.d));
  }

  const Red reduces[] = {{COMM_FLOAT32, COMM_SUM, 1023, false}, {COMM_INT32, COMM_PROD, 65537, true},
                         {COMM_BFLOAT16, COMM_AVG, 1048579, false}};
  int root = 0;
  for (const Red& a : reduces) {
    root = (root + 1) % n;
    const std::string what = std::string("reduce ") + dtype_name(a.d) + " " + op_name(a.op) + " " +
                             std::to_string(a.count) + " root " + std::to_string(root);
    unsigned char* src = a.in_place ? recv : send;
    fill_input(src, a.count, a.d, a.op, ++seed, r, 0);
    if (!k.status(comm_reduce(c, src, recv, a.count, a.d, a.op, root, nullptr), what)) return 1;
    if (r == root) k.result(check_reduced(recv, a.count, a.d, a.op, seed, n, 0), what);
  }

  const Red broadcasts[] = {{COMM_FLOAT64, COMM_SUM, 1048579, false}, {COMM_UINT8, COMM_SUM, 7, true},
                            {COMM_FLOAT16, COMM_SUM, 1023, false}};
  root = 0;
  for (const Red& a : broadcasts) {
    root = (root + n - 1) % n;
    const std::string what = std::string("broadcast ") + dtype_name(a.d) + " " + std::to_string(a.count) + " root " +
                             std::to_string(root);
    unsigned char* src = a.in_place ? recv : send;
    fill_input(src, a.count, a.d, COMM_SUM, ++seed, r, 0);  // only the root's matters
    if (!k.status(comm_broadcast(c, src, recv, a.count, a.d, root, nullptr), what)) return 1;
    k.result(check_copied(recv, a.count, a.d, COMM_SUM, seed, root, 0), what);
    k.hash(what, recv, a.count * dtype_size(a.d));
  }

  const Red allgathers[] = {{COMM_FLOAT16, COMM_SUM, 1023, false}, {COMM_UINT32, COMM_SUM, 262147, true},
                            {COMM_INT8, COMM_SUM, 1048579, false}};
  for (const Red& a : allgathers) {
    const size_t es = dtype_size(a.d);
    const std::string what = std::string("allgather ") + dtype_name(a.d) + " " + std::to_string(a.count) +
                             (a.in_place ? " in-place" : "");
    unsigned char* src = a.in_place ? recv + static_cast<size_t>(r) * a.count * es : send;
    fill_input(src, a.count, a.d, COMM_SUM, ++seed, r, 0);
    if (!k.status(comm_allgather(c, src, recv, a.count, a.d, nullptr), what)) return 1;
    for (int j = 0; j < n; ++j) {
      k.result(check_copied(recv + static_cast<size_t>(j) * a.count * es, a.count, a.d, COMM_SUM, seed, j, 0), what);
    }
    k.hash(what, recv, un * a.count * es);
  }

  const Red scatters[] = {{COMM_FLOAT32, COMM_SUM, 262147, false}, {COMM_BFLOAT16, COMM_MAX, 7, true},
                          {COMM_INT64, COMM_AVG, 1023, false}};
  for (const Red& a : scatters) {
    const size_t es = dtype_size(a.d);
    const std::string what = std::string("reduce_scatter ") + dtype_name(a.d) + " " + op_name(a.op) + " " +
                             std::to_string(a.count) + (a.in_place ? " in-place" : "");
    fill_input(send, un * a.count, a.d, a.op, ++seed, r, 0);
    unsigned char* dst = a.in_place ? send + static_cast<size_t>(r) * a.count * es : recv;
    if (!k.status(comm_reduce_scatter(c, send, dst, a.count, a.d, a.op, nullptr), what)) return 1;
    k.result(check_reduced(dst, a.count, a.d, a.op, seed, n, static_cast<size_t>(r) * a.count), what);
  }

  const Red alltoalls[] = {{COMM_INT64, COMM_SUM, 1023, false}, {COMM_UINT8, COMM_SUM, 65537, true},
                           {COMM_FLOAT32, COMM_SUM, 262147, false}};
  for (const Red& a : alltoalls) {
    const size_t es = dtype_size(a.d);
    const std::string what = std::string("alltoall ") + dtype_name(a.d) + " " + std::to_string(a.count) +
                             (a.in_place ? " in-place" : "");
    unsigned char* src = a.in_place ? recv : send;
    fill_input(src, un * a.count, a.d, COMM_SUM, ++seed, r, 0);
    if (!k.status(comm_alltoall(c, src, recv, a.count, a.d, nullptr), what)) return 1;
    for (int j = 0; j < n; ++j) {
      k.result(check_copied(recv + static_cast<size_t>(j) * a.count * es, a.count, a.d, COMM_SUM, seed, j,
                            static_cast<size_t>(r) * a.count),
               what);
    }
  }

  if (!k.status(comm_barrier(c, nullptr), "barrier")) return 1;

  // Grouped ring: send right, receive from left.
  {
    const size_t count = 1048579;
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    fill_input(send, count, COMM_FLOAT32, COMM_SUM, ++seed, r, 0);
    comm_status_t st = comm_group_start();
    const comm_status_t s1 = comm_send(c, send, count, COMM_FLOAT32, right, nullptr);
    const comm_status_t s2 = comm_recv(c, recv, count, COMM_FLOAT32, left, nullptr);
    const comm_status_t s3 = comm_group_end();
    for (comm_status_t s : {s1, s2, s3}) {
      if (st == COMM_OK) st = s;
    }
    if (!k.status(st, "send/recv ring")) return 1;
    k.result(check_copied(recv, count, COMM_FLOAT32, COMM_SUM, seed, left, 0), "send/recv ring");
  }

  // Non-blocking, back to back.
  {
    const size_t count = 65537;
    fill_input(send, count, COMM_FLOAT64, COMM_SUM, ++seed, r, 0);
    comm_request_t a = nullptr, b = nullptr;
    comm_status_t st = comm_iallreduce(c, send, recv, count, COMM_FLOAT64, COMM_SUM, &a);
    if (st == COMM_OK) st = comm_ibarrier(c, &b);
    if (st == COMM_OK) st = comm_wait(b);
    if (st == COMM_OK) st = comm_wait(a);
    if (!k.status(st, "iallreduce + ibarrier")) return 1;
    k.result(check_reduced(recv, count, COMM_FLOAT64, COMM_SUM, seed, n, 0), "iallreduce");
    k.hash("iallreduce", recv, count * 8);
  }
  return 0;
}

int mode_collectives() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (!c) return 2;
  Checker k(c, rank, n);
  run_collectives(c, k);
  const comm_status_t st = comm_destroy(c);
  if (st != COMM_OK) k.fail("comm_destroy returned " + std::to_string(st));
  say("DONE " + std::to_string(k.failures));
  return k.failures ? 1 : 0;
}

int mode_init() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (c) {
    comm_barrier(c, nullptr);
    comm_destroy(c);
  }
  return 0;
}

// comm_mem_alloc buffers (shared memory local peers read in place) on the world, a dup and an
// even/odd split: all-reduces small and large, in and out of place, checked and hashed.
int mode_shm() {
  int rank = -1, n = -1;
  comm_t world = init_or_report(&rank, &n);
  if (!world) return 2;
  Checker k(world, rank, n);
  comm_t dup = nullptr, split = nullptr;
  k.status(comm_dup(world, &dup), "comm_dup");
  k.status(comm_split(world, rank % 2, rank, &split), "comm_split");
  struct Case {
    comm_dtype_t d;
    comm_op_t op;
    size_t count;
  };
  const Case cases[] = {{COMM_FLOAT32, COMM_SUM, 7},       {COMM_FLOAT32, COMM_SUM, 4099},
                        {COMM_BFLOAT16, COMM_AVG, 1048579}, {COMM_INT64, COMM_MAX, 262147},
                        {COMM_FLOAT32, COMM_SUM, 4194307}};
  uint64_t seed = 100;
  for (comm_t c : {world, dup, split}) {
    if (c == nullptr) continue;
    int r = -1, size = -1;
    comm_rank(c, &r);
    comm_size(c, &size);
    const std::string which = c == world ? "world" : c == dup ? "dup" : "split" + std::to_string(rank % 2);
    for (const Case& a : cases) {
      for (bool in_place : {false, true}) {
        const size_t bytes = a.count * dtype_size(a.d);
        void* send = nullptr;
        void* recv = nullptr;
        const std::string what = which + " allreduce " + dtype_name(a.d) + " " + op_name(a.op) + " " +
                                 std::to_string(a.count) + (in_place ? " in-place" : "") + " (comm_mem_alloc)";
        if (!k.status(comm_mem_alloc(c, bytes, &send), what + ": comm_mem_alloc")) return 1;
        if (!k.status(comm_mem_alloc(c, bytes, &recv), what + ": comm_mem_alloc")) return 1;
        auto* src = static_cast<unsigned char*>(in_place ? recv : send);
        fill_input(src, a.count, a.d, a.op, ++seed, r, 0);
        if (!k.status(comm_allreduce(c, src, recv, a.count, a.d, a.op, nullptr), what)) return 1;
        k.result(check_reduced(static_cast<unsigned char*>(recv), a.count, a.d, a.op, seed, size, 0), what);
        k.hash(what, recv, bytes);
        k.status(comm_mem_free(c, send), what + ": comm_mem_free");
        k.status(comm_mem_free(c, recv), what + ": comm_mem_free");
      }
    }
  }
  for (comm_t c : {split, dup, world})
    if (c != nullptr && comm_destroy(c) != COMM_OK) k.fail("comm_destroy failed");
  say("DONE " + std::to_string(k.failures));
  return k.failures ? 1 : 0;
}

// Many small collectives over a few seconds while the harness sprays garbage at every
// listening port of the job.
int mode_garbage() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (!c) return 2;
  Checker k(c, rank, n);
  say("READY");
  std::vector<unsigned char> send(262147 * 4), recv(262147 * 4);
  for (int i = 0; i < 150 && k.failures == 0; ++i) {
    const size_t count = i % 10 == 9 ? 262147 : 1023;
    const uint64_t seed = 5000 + static_cast<uint64_t>(i);
    fill_input(send.data(), count, COMM_FLOAT32, COMM_SUM, seed, rank, 0);
    const std::string what = "iteration " + std::to_string(i) + " allreduce " + std::to_string(count);
    if (!k.status(comm_allreduce(c, send.data(), recv.data(), count, COMM_FLOAT32, COMM_SUM, nullptr), what)) break;
    k.result(check_reduced(recv.data(), count, COMM_FLOAT32, COMM_SUM, seed, n, 0), what);
    if (!k.status(comm_barrier(c, nullptr), "iteration " + std::to_string(i) + " barrier")) break;
    usleep(10000);
  }
  const comm_status_t st = comm_destroy(c);
  if (st != COMM_OK) k.fail("comm_destroy returned " + std::to_string(st));
  say("DONE " + std::to_string(k.failures));
  return k.failures ? 1 : 0;
}

}  // namespace rank_worker

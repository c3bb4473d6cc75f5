// rank_worker's receives from any rank (COMM_ANY_SOURCE): any_source and any_source_timeout.
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

// Receives from any rank (COMM_ANY_SOURCE), 3 or more ranks; rank 0 receives, the others send.
// Every message carries its sender and its number, so rank 0 checks what it got against the
// source libcomm reported, and that one sender's messages came in the order sent.
int mode_any_source() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (!c) return 2;
  Checker k(c, rank, n);
  const int per = 20;  // messages per sender in phase 1
  std::vector<int32_t> msg(4);
  auto fill = [&](int32_t i) { msg = {rank, i, rank, i}; };
  // Local misuse: INVALID_ARGUMENT, the communicator stays usable.
  int src = 0;
  int32_t one = 0;
  comm_request_t req = nullptr;
  if (comm_send(c, &one, 1, COMM_INT32, COMM_ANY_SOURCE, nullptr) != COMM_ERR_INVALID_ARGUMENT)
    k.fail("a send to COMM_ANY_SOURCE is not INVALID_ARGUMENT");
  if (comm_recv_any(c, &one, 0, COMM_INT32, &src, nullptr) != COMM_ERR_INVALID_ARGUMENT)
    k.fail("a receive of 0 elements from any rank is not INVALID_ARGUMENT");
  comm_group_start();
  const comm_status_t grouped = comm_recv(c, &one, 1, COMM_INT32, COMM_ANY_SOURCE, nullptr);
  comm_group_end();
  if (grouped != COMM_ERR_INVALID_ARGUMENT) k.fail("a receive from any rank inside a group is not INVALID_ARGUMENT");

  // Phase 1: every other rank sends `per` messages; rank 0 takes them all from any rank,
  // alternating comm_recv_any, comm_irecv_any and comm_recv(COMM_ANY_SOURCE) (no source: the
  // content says who sent it).
  if (rank != 0) {
    for (int32_t i = 0; i < per; ++i) {
      fill(i);
      if (!k.status(comm_send(c, msg.data(), 4, COMM_INT32, 0, nullptr), "phase 1 send " + std::to_string(i))) break;
    }
  } else {
    std::vector<int> next(static_cast<size_t>(n), 0);
    for (int m = 0; m < per * (n - 1) && k.failures == 0; ++m) {
      std::vector<int32_t> got(4, -1);
      src = -7;
      const std::string what = "phase 1 receive " + std::to_string(m);
      if (m % 3 == 0) {
        if (!k.status(comm_recv_any(c, got.data(), 4, COMM_INT32, &src, nullptr), what)) break;
      } else if (m % 3 == 1) {
        if (!k.status(comm_irecv_any(c, got.data(), 4, COMM_INT32, &src, &req), what)) break;
        if (!k.status(comm_wait(req), what + " (wait)")) break;
      } else {
        if (!k.status(comm_recv(c, got.data(), 4, COMM_INT32, COMM_ANY_SOURCE, nullptr), what)) break;
        src = got[0];
      }
      if (src < 1 || src >= n || got[0] != src || got[2] != src)
        k.fail(what + ": reported source " + std::to_string(src) + " but the message says " + std::to_string(got[0]));
      else if (got[1] != next[static_cast<size_t>(src)] || got[3] != got[1])
        k.fail(what + ": from rank " + std::to_string(src) + " message " + std::to_string(got[1]) + " came when " +
               std::to_string(next[static_cast<size_t>(src)]) + " was next (overtaken)");
      else
        ++next[static_cast<size_t>(src)];
    }
  }
  k.status(comm_barrier(c, nullptr), "barrier after phase 1");

  // Phase 2: a directed receive posted before receives from any rank takes its rank's first
  // message; and a receive from any rank posted before a directed one takes the first.
  if (rank == 1 || rank == 2) {
    for (int32_t i = 0; i < (rank == 1 ? 2 : 1); ++i) {
      fill(100 + i);
      k.status(comm_send(c, msg.data(), 4, COMM_INT32, 0, nullptr), "phase 2 send");
    }
  } else if (rank == 0) {
    std::vector<int32_t> a(4, -1), b(4, -1), d(4, -1);
    int sb = -1, sd = -1;
    comm_request_t ra = nullptr, rb = nullptr, rd = nullptr;
    k.status(comm_irecv(c, a.data(), 4, COMM_INT32, 1, &ra), "phase 2 irecv from 1");
    k.status(comm_irecv_any(c, b.data(), 4, COMM_INT32, &sb, &rb), "phase 2 irecv_any #1");
    k.status(comm_irecv_any(c, d.data(), 4, COMM_INT32, &sd, &rd), "phase 2 irecv_any #2");
    k.status(comm_wait(rd), "phase 2 wait any #2");
    k.status(comm_wait(ra), "phase 2 wait directed");
    k.status(comm_wait(rb), "phase 2 wait any #1");
    if (a[0] != 1 || a[1] != 100) k.fail("phase 2: the directed receive from 1 got " + std::to_string(a[0]) + "/" +
                                         std::to_string(a[1]) + ", not rank 1's first message");
    const bool right = (sb == 1 && sd == 2 && b[1] == 101 && d[0] == 2) || (sb == 2 && sd == 1 && b[0] == 2 && d[1] == 101);
    if (!right || b[0] != sb || d[0] != sd)
      k.fail("phase 2: the receives from any rank got " + std::to_string(b[0]) + "/" + std::to_string(b[1]) + " (source " +
             std::to_string(sb) + ") and " + std::to_string(d[0]) + "/" + std::to_string(d[1]) + " (source " +
             std::to_string(sd) + ")");
  }
  k.status(comm_barrier(c, nullptr), "barrier after phase 2a");
  if (rank == 2) {
    for (int32_t i = 0; i < 2; ++i) {
      fill(200 + i);
      k.status(comm_send(c, msg.data(), 4, COMM_INT32, 0, nullptr), "phase 2b send");
    }
  } else if (rank == 0) {
    std::vector<int32_t> x(4, -1), y(4, -1);
    int sx = -1;
    comm_request_t rx = nullptr, ry = nullptr;
    k.status(comm_irecv_any(c, x.data(), 4, COMM_INT32, &sx, &rx), "phase 2b irecv_any");
    k.status(comm_irecv(c, y.data(), 4, COMM_INT32, 2, &ry), "phase 2b irecv from 2");
    k.status(comm_wait(ry), "phase 2b wait directed");
    k.status(comm_wait(rx), "phase 2b wait any");
    if (sx != 2 || x[1] != 200 || y[1] != 201)
      k.fail("phase 2b: the receive from any rank (posted first) got message " + std::to_string(x[1]) + " (source " +
             std::to_string(sx) + "), the directed one " + std::to_string(y[1]) + ": expected 200 then 201");
  }
  k.status(comm_barrier(c, nullptr), "barrier after phase 2b");

  // Phase 3: large messages (zero-copy over shared memory, striped over sockets), every rank
  // to rank 0 at once, while rank 0 also sends to rank 1 (a send is never held back).
  const size_t big = 300007;
  std::vector<int32_t> large(big);
  if (rank != 0) {
    for (size_t i = 0; i < big; ++i) large[i] = static_cast<int32_t>(rank * 1000003 + static_cast<int>(i));
    k.status(comm_send(c, large.data(), big, COMM_INT32, 0, nullptr), "phase 3 send");
    if (rank == 1) {
      k.status(comm_recv(c, &one, 1, COMM_INT32, 0, nullptr), "phase 3 receive from 0");
      if (one != 77) k.fail("phase 3: rank 0's message is " + std::to_string(one));
    }
  } else {
    one = 77;
    comm_request_t rs = nullptr;
    k.status(comm_isend(c, &one, 1, COMM_INT32, 1, &rs), "phase 3 isend to 1");
    std::vector<bool> seen(static_cast<size_t>(n), false);
    for (int m = 0; m < n - 1; ++m) {
      src = -1;
      if (!k.status(comm_recv_any(c, large.data(), big, COMM_INT32, &src, nullptr), "phase 3 receive")) break;
      size_t wrong = 0;
      for (size_t i = 0; i < big; ++i) wrong += large[i] != static_cast<int32_t>(src * 1000003 + static_cast<int>(i));
      if (src < 1 || src >= n || seen[static_cast<size_t>(src)] || wrong != 0)
        k.fail("phase 3: source " + std::to_string(src) + ", " + std::to_string(wrong) + " wrong elements");
      else
        seen[static_cast<size_t>(src)] = true;
    }
    k.status(comm_wait(rs), "phase 3 wait isend");
  }
  k.status(comm_barrier(c, nullptr), "barrier after phase 3");
  if (comm_destroy(c) != COMM_OK) k.fail("comm_destroy failed");
  say("DONE " + std::to_string(k.failures));
  return k.failures ? 1 : 0;
}

// Rank 0 receives from any rank and nobody sends: COMM_ERR_TIMEOUT after COMM_TIMEOUT_MS, its
// message naming the receive from any rank. The others stay out of libcomm (a wait of theirs
// would time out too, and its report reach rank 0 first) until rank 0 has made the file
// ABI_ANY_SOURCE_DONE.
int mode_any_source_timeout() {
  int rank = -1, n = -1;
  comm_t c = init_or_report(&rank, &n);
  if (!c) return 2;
  const char* done = std::getenv("ABI_ANY_SOURCE_DONE");
  if (rank != 0) {
    const double t0 = mono_ms();
    while (done != nullptr && access(done, F_OK) != 0 && mono_ms() - t0 < 120000) usleep(10000);
    comm_abort(c);
    comm_destroy(c);
    say("DONE 0");
    return 0;
  }
  int32_t buf[4];
  int src = 0;
  const double t0 = mono_ms();
  const comm_status_t st = comm_recv_any(c, buf, 4, COMM_INT32, &src, nullptr);
  say("END " + std::to_string(st) + " " + std::to_string(static_cast<long>(mono_ms() - t0)) + " " + std::to_string(src));
  if (st != COMM_OK) say("MSG " + one_line(comm_last_error(c)));
  if (done != nullptr) {
    if (FILE* f = std::fopen(done, "w")) std::fclose(f);
  }
  comm_abort(c);
  comm_destroy(c);
  say("DONE 0");
  return 0;
}

}  // namespace rank_worker

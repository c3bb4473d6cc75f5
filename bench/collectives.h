// One descriptor per collective, as nccl-tests has them: element counts for a size, the
// bandwidth factors, the input of each rank, the expected output, and the call itself.
#pragma once

#include <comm/comm.h>

#include <cstddef>
#include <cstdint>

#include "values.h"

namespace bench {

class Backend;

// nccl-tests' getCollByteCount: for `count` = size / element size on `nranks` ranks.
struct Counts {
  size_t send = 0;   // elements in the send buffer
  size_t recv = 0;   // elements in the receive buffer
  size_t param = 0;  // the count argument of the call (the table's "count" column)
  size_t send_inplace_offset = 0;  // in place: sendbuf = recvbuf + rank * this
  size_t recv_inplace_offset = 0;  // in place: recvbuf = sendbuf + rank * this
};

struct Call {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // Counts::param
  comm_dtype_t dtype = COMM_FLOAT32;
  comm_op_t op = COMM_SUM;
  int root = 0;
  int rank = 0;
  int nranks = 1;
};

struct Collective {
  const char* name;       // --op-name and the JSON record: "allreduce"
  const char* perf_name;  // nccl-tests' program: "all_reduce_perf"
  bool reduces;           // the table's redop column is the op (else "none")
  bool rooted;            // the table's root column is the root (else -1)
  Counts (*counts)(size_t count, int nranks);
  bool algbw_per_rank;    // algbw = param bytes (x nranks when true) / time
  // In place is a defined operation (false for sendrecv: sending from and receiving into one
  // buffer races with the neighbour's read, so that column is timed as nccl-tests does, not checked).
  bool in_place_checked;
  double (*busbw_factor)(int nranks);
  // Fills this rank's input (Counts::send elements at `send`) for `seed`.
  void (*init)(const DtypeInfo& d, const Call& c, uint64_t seed, unsigned char* send);
  // Elements of this rank's output (at c.recv) that differ from what `seed` gives.
  int64_t (*check)(const DtypeInfo& d, const Call& c, uint64_t seed);
  bool (*run)(Backend& b, const Call& c);
};

// By name ("allreduce", "all_reduce", "all_reduce_perf", "comm-bench-allreduce"...); nullptr if unknown.
const Collective* find_collective(const char* name);
// Every collective, in nccl-tests' order.
const Collective* const* all_collectives(size_t* n);

}  // namespace bench

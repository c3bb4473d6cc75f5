// The seven collectives of nccl-tests with nccl-tests' counts and bandwidth definitions
// (docs/design/tools.md, "Bandwidth definitions"), and the expected output of each as a function of (seed, rank, index).
#include "collectives.h"

#include <cstring>
#include <string>

#include "backend.h"

namespace bench {
namespace {

uint64_t bound_of(const DtypeInfo& d, const Call& c) { return value_bound(d, c.op, c.nranks); }

Period input_of(const DtypeInfo& d, const Call& c, uint64_t seed, int rank) {
  return input_period(d, seed, rank, bound_of(d, c));
}

// Every rank's input: its own sequence from index 0.
void init_own(const DtypeInfo& d, const Call& c, uint64_t seed, unsigned char* send, size_t count) {
  fill(send, count, d.bytes, input_of(d, c, seed, c.rank), 0);
}

const unsigned char* out_of(const Call& c) { return static_cast<const unsigned char*>(c.recv); }

double one(int) { return 1.0; }
double ring_share(int n) { return n > 0 ? static_cast<double>(n - 1) / n : 0.0; }

// ---- allreduce ----
Counts allreduce_counts(size_t count, int) { return {count, count, count, 0, 0}; }
void allreduce_init(const DtypeInfo& d, const Call& c, uint64_t seed, unsigned char* send) {
  init_own(d, c, seed, send, c.count);
}
int64_t allreduce_check(const DtypeInfo& d, const Call& c, uint64_t seed) {
  return count_wrong(out_of(c), c.count, d.bytes, reduced_period(d, c.op, seed, c.nranks, bound_of(d, c)), 0);
}
bool allreduce_run(Backend& b, const Call& c) { return b.allreduce(c.send, c.recv, c.count, c.dtype, c.op); }
double allreduce_bus(int n) { return n > 0 ? 2.0 * (n - 1) / n : 0.0; }

// ---- allgather: recv holds every rank's send block, in rank order ----
Counts allgather_counts(size_t count, int n) {
  const size_t base = count / static_cast<size_t>(n);
  return {base, base * static_cast<size_t>(n), base, base, 0};
}
void allgather_init(const DtypeInfo& d, const Call& c, uint64_t seed, unsigned char* send) {
  init_own(d, c, seed, send, c.count);
}
int64_t allgather_check(const DtypeInfo& d, const Call& c, uint64_t seed) {
  int64_t wrong = 0;
  for (int r = 0; r < c.nranks; ++r)
    wrong += count_wrong(out_of(c) + static_cast<size_t>(r) * c.count * d.bytes, c.count, d.bytes,
                         input_of(d, c, seed, r), 0);
  return wrong;
}
bool allgather_run(Backend& b, const Call& c) { return b.allgather(c.send, c.recv, c.count, c.dtype); }

// ---- reduce_scatter: rank r gets block r of the reduction ----
Counts reduce_scatter_counts(size_t count, int n) {
  const size_t base = count / static_cast<size_t>(n);
  return {base * static_cast<size_t>(n), base, base, 0, base};
}
void reduce_scatter_init(const DtypeInfo& d, const Call& c, uint64_t seed, unsigned char* send) {
  init_own(d, c, seed, send, c.count * static_cast<size_t>(c.nranks));
}
int64_t reduce_scatter_check(const DtypeInfo& d, const Call& c, uint64_t seed) {
  return count_wrong(out_of(c), c.count, d.bytes, reduced_period(d, c.op, seed, c.nranks, bound_of(d, c)),
                     static_cast<size_t>(c.rank) * c.count);
}
bool reduce_scatter_run(Backend& b, const Call& c) {
  return b.reduce_scatter(c.send, c.recv, c.count, c.dtype, c.op);
}

// ---- broadcast: everyone gets the root's input ----
Counts plain_counts(size_t count, int) { return {count, count, count, 0, 0}; }
void broadcast_init(const DtypeInfo& d, const Call& c, uint64_t seed, unsigned char* send) {
  init_own(d, c, seed, send, c.count);
}
int64_t broadcast_check(const DtypeInfo& d, const Call& c, uint64_t seed) {
  return count_wrong(out_of(c), c.count, d.bytes, input_of(d, c, seed, c.root), 0);
}
bool broadcast_run(Backend& b, const Call& c) { return b.broadcast(c.send, c.recv, c.count, c.dtype, c.root); }

// ---- reduce: only the root's output is defined ----
int64_t reduce_check(const DtypeInfo& d, const Call& c, uint64_t seed) {
  if (c.rank != c.root) return 0;
  return allreduce_check(d, c, seed);
}
bool reduce_run(Backend& b, const Call& c) { return b.reduce(c.send, c.recv, c.count, c.dtype, c.op, c.root); }

// ---- alltoall: block j of rank r's input goes to rank j, at block r ----
Counts alltoall_counts(size_t count, int n) {
  const size_t base = count / static_cast<size_t>(n);
  return {base * static_cast<size_t>(n), base * static_cast<size_t>(n), base, 0, 0};
}
void alltoall_init(const DtypeInfo& d, const Call& c, uint64_t seed, unsigned char* send) {
  init_own(d, c, seed, send, c.count * static_cast<size_t>(c.nranks));
}
int64_t alltoall_check(const DtypeInfo& d, const Call& c, uint64_t seed) {
  int64_t wrong = 0;
  for (int r = 0; r < c.nranks; ++r)
    wrong += count_wrong(out_of(c) + static_cast<size_t>(r) * c.count * d.bytes, c.count, d.bytes,
                         input_of(d, c, seed, r), static_cast<size_t>(c.rank) * c.count);
  return wrong;
}
bool alltoall_run(Backend& b, const Call& c) { return b.alltoall(c.send, c.recv, c.count, c.dtype); }

// ---- sendrecv: a ring, each rank sends to the next and receives from the previous ----
int64_t sendrecv_check(const DtypeInfo& d, const Call& c, uint64_t seed) {
  return count_wrong(out_of(c), c.count, d.bytes, input_of(d, c, seed, (c.rank + c.nranks - 1) % c.nranks), 0);
}
bool sendrecv_run(Backend& b, const Call& c) {
  return b.sendrecv(c.send, c.recv, c.count, c.dtype, (c.rank + 1) % c.nranks, (c.rank + c.nranks - 1) % c.nranks);
}

const Collective kAllreduce = {"allreduce", "all_reduce_perf", true, false, allreduce_counts, false, true,
                               allreduce_bus, allreduce_init, allreduce_check, allreduce_run};
const Collective kAllgather = {"allgather", "all_gather_perf", false, false, allgather_counts, true, true,
                               ring_share, allgather_init, allgather_check, allgather_run};
const Collective kReduceScatter = {"reduce_scatter", "reduce_scatter_perf", true, false, reduce_scatter_counts, true,
                                   true, ring_share, reduce_scatter_init, reduce_scatter_check, reduce_scatter_run};
const Collective kBroadcast = {"broadcast", "broadcast_perf", false, true, plain_counts, false, true,
                               one, broadcast_init, broadcast_check, broadcast_run};
const Collective kReduce = {"reduce", "reduce_perf", true, true, plain_counts, false, true,
                            one, allreduce_init, reduce_check, reduce_run};
const Collective kAlltoall = {"alltoall", "alltoall_perf", false, false, alltoall_counts, true, true,
                              ring_share, alltoall_init, alltoall_check, alltoall_run};
const Collective kSendrecv = {"sendrecv", "sendrecv_perf", false, false, plain_counts, false, false,
                              one, allreduce_init, sendrecv_check, sendrecv_run};

const Collective* const kAll[] = {&kAllreduce, &kAllgather, &kReduceScatter, &kBroadcast,
                                  &kReduce,    &kAlltoall,  &kSendrecv};

std::string squash(const char* text) {  // "All_Reduce" -> "allreduce"
  std::string out;
  for (const char* p = text; *p != '\0'; ++p)
    if (*p != '_' && *p != '-') out += static_cast<char>(*p | 0x20);
  return out;
}

}  // namespace

const Collective* find_collective(const char* name) {
  std::string key = squash(name);
  for (const char* suffix : {"perf"})
    if (key.size() > std::strlen(suffix) && key.ends_with(suffix)) key.resize(key.size() - std::strlen(suffix));
  for (const char* prefix : {"commbench"})
    if (key.starts_with(prefix)) key.erase(0, std::strlen(prefix));
  for (const Collective* c : kAll)
    if (key == squash(c->name)) return c;
  return nullptr;
}

const Collective* const* all_collectives(size_t* n) {
  *n = sizeof kAll / sizeof kAll[0];
  return kAll;
}

}  // namespace bench

// An NCCL without a GPU, for the no-GPU tests of libcomm's NCCL path: ranks are threads of one
// process; a communicator's ranks meet by unique id; collectives run at the call (float32 sum,
// max and avg across ranks, avg as NCCL computes it for floats: each input times 1/n, summed; the other collectives as copies at world size 1). Init answers
// ncclInProgress first, as a nonblocking NCCL does. fake_nccl_set_async_error() makes
// ncclCommGetAsyncError report an error; fake_nccl_aborts() counts ncclCommAbort calls.
// FAKE_NCCL_REPORT_ENV=1: each init prints the NCCL_* environment it sees (stderr).
#include <nccl.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Group {  // the ranks of one communicator
  int nranks = 0;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0, generation = 0;
  std::vector<const void*> inputs;
  void barrier() {
    std::unique_lock<std::mutex> lock(mu);
    const int gen = generation;
    if (++arrived == nranks) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }
};

struct Comm {
  int rank = 0, nranks = 1;
  Group* group = nullptr;
  int init_polls = 2;  // ncclInProgress this many times before ncclSuccess
};

std::mutex registry_mu;
std::map<std::string, Group*> groups;
int async_error = ncclSuccess;
int aborts = 0, allreduces = 0, mem_allocs = 0, registrations = 0;

}  // namespace

extern "C" {
#define FAKE __attribute__((visibility("default")))
FAKE void fake_nccl_set_async_error(int e) { async_error = e; }
FAKE int fake_nccl_aborts(void) { return aborts; }
FAKE int fake_nccl_allreduces(void) { return allreduces; }
FAKE int fake_nccl_mem_allocs(void) { return mem_allocs; }
FAKE int fake_nccl_registrations(void) { return registrations; }

FAKE ncclResult_t ncclGetVersion(int* v) { *v = 22304; return ncclSuccess; }  // 2.23.4: no ncclCommShrink
FAKE const char* ncclGetErrorString(ncclResult_t) { return "fake NCCL error"; }
FAKE const char* ncclGetLastError(ncclComm_t) { return "the fake NCCL says so"; }
FAKE ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static int next = 0;
  std::memset(id, 0, sizeof *id);
  std::snprintf(id->internal, sizeof id->internal, "fake-%d-%d", static_cast<int>(reinterpret_cast<uintptr_t>(&next) & 0xffff), ++next);
  return ncclSuccess;
}
FAKE ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  // What a real NCCL would read from its environment at this init: FAKE_NCCL_REPORT_ENV=1 prints
  // every NCCL_* variable, so a test can see what libcomm set before NCCL's first init.
  if (const char* report = std::getenv("FAKE_NCCL_REPORT_ENV"); report != nullptr && report[0] == '1') {
    for (char** e = environ; *e != nullptr; ++e)
      if (std::strncmp(*e, "NCCL_", 5) == 0) std::fprintf(stderr, "fake NCCL init (rank %d): env %s\n", rank, *e);
  }
  auto* c = new Comm;
  const bool blocking = config == nullptr || config->blocking != 0;  // libcomm asks for nonblocking
  if (blocking) c->init_polls = 0;
  c->rank = rank;
  c->nranks = nranks;
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    Group*& g = groups[std::string(id.internal, sizeof id.internal)];
    if (g == nullptr) {
      g = new Group;
      g->nranks = nranks;
      g->inputs.resize(static_cast<size_t>(nranks));
    }
    c->group = g;
  }
  *out = reinterpret_cast<ncclComm_t>(c);
  return blocking ? ncclSuccess : ncclInProgress;
}
FAKE ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* e) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (c->init_polls > 0) {
    --c->init_polls;
    *e = ncclInProgress;
    return ncclSuccess;
  }
  *e = static_cast<ncclResult_t>(async_error);
  return ncclSuccess;
}
FAKE ncclResult_t ncclCommAbort(ncclComm_t comm) {
  ++aborts;
  delete reinterpret_cast<Comm*>(comm);
  return ncclSuccess;
}
FAKE ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }
FAKE ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete reinterpret_cast<Comm*>(comm);
  return ncclSuccess;
}

FAKE ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (c->rank == 0) ++allreduces;
  if (t != ncclFloat32 || (op != ncclSum && op != ncclMax && op != ncclAvg)) {
    if (c->nranks != 1) return ncclInvalidArgument;
    std::memmove(r, s, n * (t == ncclFloat64 || t == ncclInt64 || t == ncclUint64 ? 8 : 4));
    return ncclSuccess;
  }
  Group& g = *c->group;
  std::vector<float> out(n);
  g.inputs[static_cast<size_t>(c->rank)] = s;
  g.barrier();
  const float scale = op == ncclAvg ? 1.0f / static_cast<float>(c->nranks) : 1.0f;
  for (size_t i = 0; i < n; ++i) {
    float v = static_cast<const float*>(g.inputs[0])[i] * scale;
    for (int k = 1; k < c->nranks; ++k) {
      const float x = static_cast<const float*>(g.inputs[static_cast<size_t>(k)])[i] * scale;
      v = op != ncclMax ? v + x : (x > v ? x : v);
    }
    out[i] = v;
  }
  g.barrier();  // every rank has read every input before anyone writes its output
  std::memcpy(r, out.data(), n * sizeof(float));
  return ncclSuccess;
}
// World size 1 only: a copy of `bytes` (float32 elements in the tests).
static ncclResult_t copy1(ncclComm_t comm, const void* s, void* r, size_t n) {
  if (reinterpret_cast<Comm*>(comm)->nranks != 1) return ncclInvalidUsage;
  if (s && r) std::memmove(r, s, n * 4);
  return ncclSuccess;
}
FAKE ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, ncclDataType_t, int, ncclComm_t c, cudaStream_t) { return copy1(c, s, r, n); }
FAKE ncclResult_t ncclReduce(const void* s, void* r, size_t n, ncclDataType_t, ncclRedOp_t, int, ncclComm_t c, cudaStream_t) { return copy1(c, s, r, n); }
FAKE ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t, ncclComm_t c, cudaStream_t) { return copy1(c, s, r, n); }
FAKE ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, ncclDataType_t, ncclRedOp_t, ncclComm_t c, cudaStream_t) { return copy1(c, s, r, n); }
static thread_local const void* pending_send = nullptr;  // a send to oneself, paired with the next receive
FAKE ncclResult_t ncclSend(const void* s, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { pending_send = s; return ncclSuccess; }
FAKE ncclResult_t ncclRecv(void* r, size_t n, ncclDataType_t, int, ncclComm_t c, cudaStream_t) {
  const void* s = pending_send;
  pending_send = nullptr;
  return copy1(c, s, r, n);
}
FAKE ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
FAKE ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }
FAKE ncclResult_t ncclMemAlloc(void** p, size_t n) {
  ++mem_allocs;
  *p = std::malloc(n);
  return *p ? ncclSuccess : ncclSystemError;
}
FAKE ncclResult_t ncclMemFree(void* p) { std::free(p); return ncclSuccess; }
FAKE ncclResult_t ncclCommRegister(ncclComm_t, void*, size_t, void** handle) { ++registrations; *handle = reinterpret_cast<void*>(0x1); return ncclSuccess; }
FAKE ncclResult_t ncclCommDeregister(ncclComm_t, void*) { return ncclSuccess; }
}

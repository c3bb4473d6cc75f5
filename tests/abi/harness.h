// Ranks as threads for the ABI tests: start N ranks over a memory:// store, run a body on
// each, collect what happened. Catch2 assertions are not thread-safe, so rank threads only
// record (statuses, messages, failures) and the test's own thread asserts afterwards.
#pragma once

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../support/loaded_host.h"
#include "comm/comm.h"
#include "reference.h"

namespace abi {

// "memory://abi-<what>-<pid>-<sequence>": unique per test and per run.
std::string unique_init_method(const std::string& what);
// init_method must outlive the comm_init call.
comm_config_t make_config(const std::string& init_method, int rank, int world_size, int timeout_ms);

double now_ms();  // steady clock
std::string status_name(comm_status_t s);  // "COMM_ERR_TIMEOUT" (the test's names, not libcomm's)
bool icontains(const std::string& haystack, const std::string& needle);
std::string last_error(comm_t comm);  // comm_last_error, "(null)" if it returned NULL

// Sum over ranks of `value` with an int64 allreduce; -1 and the message on failure.
struct Reduced {
  comm_status_t status = COMM_OK;
  int64_t sum = -1;
  std::string message;
};
Reduced allreduce_sum(comm_t c, int64_t value);

// fn(rank) on n threads at once; the results in rank order.
template <class F>
auto on_ranks(int n, F fn) {
  using R = std::invoke_result_t<F, int>;
  if constexpr (std::is_void_v<R>) {
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) threads.emplace_back([&fn, r] { fn(r); });
    for (auto& t : threads) t.join();
  } else {
    std::vector<R> out(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) threads.emplace_back([&fn, &out, r] { out[static_cast<size_t>(r)] = fn(r); });
    for (auto& t : threads) t.join();
    return out;
  }
}

// What one call did: its status, the thread's last error if it failed, how long it took.
struct Outcome {
  comm_status_t status = COMM_OK;
  std::string message;
  double ms = 0;
};
template <class F>
Outcome timed(comm_t comm, F call) {
  Outcome o;
  const double t0 = now_ms();
  o.status = call();
  o.ms = now_ms() - t0;
  if (o.status != COMM_OK) o.message = last_error(comm);
  return o;
}
std::string describe(const Outcome& o);  // "COMM_ERR_X after 12 ms: message"

struct Ranks {
  std::vector<comm_t> comms;      // nullptr where init failed
  std::vector<Outcome> outcomes;  // each rank's comm_init
  bool all_ok() const;
  std::string describe() const;   // every rank's outcome, one per line
};
using ConfigTweak = std::function<void(int rank, comm_config_t& cfg)>;
// comm_init on n threads (ranks as threads over one memory:// store).
Ranks init_ranks(int n, const std::string& what, int timeout_ms, const ConfigTweak& tweak = {});
// comm_destroy on every non-null handle, all ranks at once (a graceful destroy may wait for peers).
void destroy_ranks(std::vector<comm_t>& comms);

// Thread-safe list of failures recorded by rank threads; the first few keep their text.
class Failures {
 public:
  void add(const std::string& what);
  size_t count() const { return count_.load(); }
  std::string summary(size_t max_lines = 12) const;  // "" when nothing failed

 private:
  mutable std::mutex mu_;
  std::vector<std::string> first_;
  std::atomic<size_t> count_{0};
};

// ---- the sweep's shared resources ----
// Communicators for n ranks, created once and reused by every test that asks (init costs);
// recreated when a test reports it broken. Destroyed when the test run ends.
std::vector<comm_t>& shared_world(int n);
void mark_shared_world_broken(int n);
void destroy_shared_worlds();  // at the end of the run (a Catch2 listener calls it)

// Rank r's buffers in any world, allocated and touched once and reused. Each holds
// kSlotElems elements of 8 bytes: a 5-rank allgather/alltoall/reduce_scatter of 1048579.
inline constexpr size_t kMaxRanks = 5;
inline constexpr size_t kSlotBytes = kMaxRanks * kLargeCount * 8;
unsigned char* send_slot(int rank);
unsigned char* recv_slot(int rank);

// One rank's view while a collective body runs on all ranks of a shared world.
struct Step;
struct RankCtx {
  int rank = 0;
  int n = 0;
  comm_t comm = nullptr;
  unsigned char* send = nullptr;
  unsigned char* recv = nullptr;
  Step* step = nullptr;
  unsigned char* recv_of(int r) const;  // another rank's recv buffer (read only after settle's barrier)
  unsigned char* send_of(int r) const;
  // Records st; waits for every rank; runs verify() unless a call failed somewhere; waits again
  // so buffers can be reused. Returns false once the world is broken (all ranks agree).
  bool settle(comm_status_t st, const std::string& what, const std::function<void()>& verify);
  void fail(const std::string& what);
};

// Runs body on every rank of the shared n-rank world; returns the failures' summary.
std::string run_on_shared_world(int n, const std::function<void(RankCtx&)>& body);

}  // namespace abi

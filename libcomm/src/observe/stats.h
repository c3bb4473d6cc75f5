// What a running communicator counts about itself, for the metrics plugin and comm-top
// (docs/observability.md): per collective its calls, bytes and a latency histogram; errors by
// kind; per peer how often its first message came last and late (straggler detection, with the
// waits themselves in transports/common/arrivals.h). Plain relaxed atomics written by the thread
// that issues the calls and read by whoever takes a snapshot; no allocation after init.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "transport.h"

namespace comm::observe {

// Upper bounds of the latency histogram, in seconds (the last bucket is +Inf).
constexpr std::array<double, 8> kLatencyBounds = {1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1, 10, 100};
constexpr size_t kKinds = 10;  // CollKind values 0..9
constexpr size_t kStatusCodes = 9;
// Straggler detection's window: a peer is named when its first message came last, and at least
// COMM_STRAGGLER_MS after this rank started, in half of the window's collectives or more.
constexpr uint32_t kWindow = 100;

struct CollStats {
  std::atomic<uint64_t> calls{0}, bytes{0}, sum_ns{0};
  std::array<std::atomic<uint64_t>, kLatencyBounds.size() + 1> buckets{};  // per bucket, not cumulative
  std::atomic<const char*> algorithm{nullptr};  // the last call's
};

class Stats {
 public:
  // At connect: the communicator's size, its label for log lines ("comm 0 rank 3"), and the
  // lateness from which a peer counts as late (COMM_STRAGGLER_MS; 0: detection off).
  void init(int size, std::string label, int64_t late_ms);
  bool detecting() const { return late_ns_ != 0; }
  uint64_t late_ns() const { return late_ns_; }

  // After each call the issuing thread ran: what it was, how long it took, which peer's first
  // message came last and how long after the start (-1: none came).
  void record(transport::CollKind kind, uint64_t bytes, uint64_t ns, const char* algorithm, int last_peer,
              uint64_t last_wait_ns);
  void error(comm_status_t code);
  // A gradient engine created on this communicator, after each synced step: the step's
  // time, the part of it the trainer blocked on communication (exposed), and the communication's
  // own time (its partitions' start to done). The engine's mutex serialises the calls.
  void engine_step(double step_us, double exposed_us, double comm_us);

  const CollStats& coll(size_t kind) const { return colls_[kind]; }
  uint64_t errors(size_t code) const { return errors_[code].load(std::memory_order_relaxed); }
  // Per peer: collectives whose last first message was this peer's, and late.
  uint64_t late(int peer) const { return late_[static_cast<size_t>(peer)].load(std::memory_order_relaxed); }
  // The last full window's verdict: the straggler (-1: none), in how many of its collectives, and
  // this rank's mean wait for it then.
  int straggler() const { return straggler_.load(std::memory_order_relaxed); }
  uint32_t straggler_count() const { return straggler_count_.load(std::memory_order_relaxed); }
  uint64_t straggler_wait_ns() const { return straggler_wait_ns_.load(std::memory_order_relaxed); }
  struct EngineTotals {
    uint64_t steps = 0;
    double step_s = 0, exposed_s = 0, comm_s = 0;   // summed over the synced steps
    double last_exposed_s = 0, last_overlap = 1;    // the last one's
  };
  EngineTotals engine() const;

 private:
  void close_window();

  std::array<CollStats, kKinds> colls_{};
  std::array<std::atomic<uint64_t>, kStatusCodes> errors_{};
  std::unique_ptr<std::atomic<uint64_t>[]> late_;
  int size_ = 0;
  std::string label_;
  uint64_t late_ns_ = 0;
  // The window, the issuing thread's alone.
  std::vector<uint32_t> window_late_;
  std::vector<uint64_t> window_wait_ns_;
  uint32_t window_calls_ = 0;
  uint32_t windows_ = 0;
  std::atomic<int> straggler_{-1};
  std::atomic<uint32_t> straggler_count_{0};
  std::atomic<uint64_t> straggler_wait_ns_{0};
  // The engine's steps, in nanoseconds (atomics: a scrape reads them from another thread).
  std::atomic<uint64_t> engine_steps_{0}, engine_step_ns_{0}, engine_exposed_ns_{0}, engine_comm_ns_{0},
      engine_last_exposed_ns_{0}, engine_last_comm_ns_{0};
};

}  // namespace comm::observe

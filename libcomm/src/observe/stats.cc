// The communicator's counters and straggler detection's window (stats.h).
#include "observe/stats.h"

#include <algorithm>

#include "log.h"

namespace comm::observe {

void Stats::init(int size, std::string label, int64_t late_ms) {
  size_ = size > 0 ? size : 0;
  label_ = std::move(label);
  late_ns_ = late_ms > 0 ? static_cast<uint64_t>(late_ms) * 1000000u : 0;
  late_.reset(new std::atomic<uint64_t>[static_cast<size_t>(size_)]);
  for (int p = 0; p < size_; ++p) late_[static_cast<size_t>(p)].store(0, std::memory_order_relaxed);
  window_late_.assign(static_cast<size_t>(size_), 0);
  window_wait_ns_.assign(static_cast<size_t>(size_), 0);
}

void Stats::record(transport::CollKind kind, uint64_t bytes, uint64_t ns, const char* algorithm, int last_peer,
                   uint64_t last_wait_ns) {
  CollStats& s = colls_[static_cast<size_t>(kind) % kKinds];
  // One writer (the issuing thread): load and store, no read-modify-write on the hot path.
  auto add = [](std::atomic<uint64_t>& a, uint64_t v) {
    a.store(a.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  };
  add(s.calls, 1);
  add(s.bytes, bytes);
  add(s.sum_ns, ns);
  size_t b = 0;
  const double seconds = static_cast<double>(ns) * 1e-9;
  while (b < kLatencyBounds.size() && seconds > kLatencyBounds[b]) ++b;
  add(s.buckets[b], 1);
  if (algorithm != nullptr) s.algorithm.store(algorithm, std::memory_order_relaxed);
  if (late_ns_ == 0 || kind == transport::CollKind::kInternal || kind == transport::CollKind::kSendRecv) return;
  if (last_peer >= 0 && last_peer < size_ && last_wait_ns >= late_ns_) {
    add(late_[static_cast<size_t>(last_peer)], 1);
    ++window_late_[static_cast<size_t>(last_peer)];
    window_wait_ns_[static_cast<size_t>(last_peer)] += last_wait_ns;
  }
  if (++window_calls_ == kWindow) close_window();
}

void Stats::error(comm_status_t code) {
  const auto c = static_cast<size_t>(code);
  if (c < kStatusCodes) errors_[c].fetch_add(1, std::memory_order_relaxed);
}

void Stats::engine_step(double step_us, double exposed_us, double comm_us) {
  auto ns = [](double us) { return us > 0 ? static_cast<uint64_t>(us * 1e3) : uint64_t{0}; };
  auto add = [](std::atomic<uint64_t>& a, uint64_t v) {
    a.store(a.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  };
  add(engine_step_ns_, ns(step_us));
  add(engine_exposed_ns_, ns(exposed_us));
  add(engine_comm_ns_, ns(comm_us));
  engine_last_exposed_ns_.store(ns(exposed_us), std::memory_order_relaxed);
  engine_last_comm_ns_.store(ns(comm_us), std::memory_order_relaxed);
  add(engine_steps_, 1);
}

Stats::EngineTotals Stats::engine() const {
  EngineTotals t;
  t.steps = engine_steps_.load(std::memory_order_relaxed);
  t.step_s = static_cast<double>(engine_step_ns_.load(std::memory_order_relaxed)) * 1e-9;
  t.exposed_s = static_cast<double>(engine_exposed_ns_.load(std::memory_order_relaxed)) * 1e-9;
  t.comm_s = static_cast<double>(engine_comm_ns_.load(std::memory_order_relaxed)) * 1e-9;
  const uint64_t exposed = engine_last_exposed_ns_.load(std::memory_order_relaxed);
  const uint64_t comm = engine_last_comm_ns_.load(std::memory_order_relaxed);
  t.last_exposed_s = static_cast<double>(exposed) * 1e-9;
  // As comm_engine_stats' overlap_ratio (engine/stats.cc): 1 - exposed / comm, in [0, 1].
  t.last_overlap = comm == 0 ? 1.0 : std::clamp(1.0 - static_cast<double>(exposed) / static_cast<double>(comm), 0.0, 1.0);
  return t;
}

// Every kWindow collectives: the peer late most often, named at INFO when it was late in half of
// them or more; said again when the verdict changes and every tenth window while it holds.
void Stats::close_window() {
  int worst = -1;
  for (int p = 0; p < size_; ++p)
    if (worst < 0 || window_late_[static_cast<size_t>(p)] > window_late_[static_cast<size_t>(worst)]) worst = p;
  const uint32_t count = worst < 0 ? 0 : window_late_[static_cast<size_t>(worst)];
  const int verdict = count * 2 >= kWindow ? worst : -1;
  const uint64_t mean = count == 0 ? 0 : window_wait_ns_[static_cast<size_t>(worst)] / count;
  const int before = straggler_.load(std::memory_order_relaxed);
  ++windows_;
  if (verdict >= 0 && (verdict != before || windows_ % 10 == 0))
    COMM_INFO(kColl, "%s: rank %d arrived last in %u of the last %u collectives, %.1f ms late on average (this "
              "rank's wait for its first message; a straggler: slow compute, a slow link, or a busy core)",
              label_.c_str(), verdict, count, kWindow, static_cast<double>(mean) * 1e-6);
  else if (verdict < 0 && before >= 0)
    COMM_INFO(kColl, "%s: rank %d is no longer late (%u of the last %u collectives)", label_.c_str(), before,
              before < size_ ? window_late_[static_cast<size_t>(before)] : 0, kWindow);
  straggler_count_.store(verdict >= 0 ? count : 0, std::memory_order_relaxed);
  straggler_wait_ns_.store(verdict >= 0 ? mean : 0, std::memory_order_relaxed);
  straggler_.store(verdict, std::memory_order_relaxed);
  window_calls_ = 0;
  for (int p = 0; p < size_; ++p) {
    window_late_[static_cast<size_t>(p)] = 0;
    window_wait_ns_[static_cast<size_t>(p)] = 0;
  }
}

}  // namespace comm::observe

// Deadlines: every wait in libcomm is bounded. A Deadline is an absolute point on
// the monotonic clock; "infinite" exists only for callers that pass no timeout.
#pragma once

#include <chrono>
#include <cstdint>

namespace comm {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  static Deadline after_ms(int64_t ms) { return Deadline(Clock::now() + std::chrono::milliseconds(ms)); }
  static Deadline never() { return Deadline(Clock::time_point::max()); }
  explicit Deadline(Clock::time_point at) : at_(at) {}

  bool expired() const { return Clock::now() >= at_; }
  // Milliseconds left, clamped to [0, cap]; for poll()/epoll_wait().
  int remaining_ms(int cap = 1000) const {
    if (at_ == Clock::time_point::max()) return cap;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    if (left < 0) return 0;
    return left > cap ? cap : static_cast<int>(left);
  }
  Clock::time_point at() const { return at_; }

 private:
  Clock::time_point at_;
};

}  // namespace comm

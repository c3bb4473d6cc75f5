// How every transport's wait measures time: it fails after COMM_TIMEOUT_MS *without progress*
// (not in total: a large message that keeps moving never times out), and after each progress it
// spins a little before it blocks, because ranks may outnumber cores (docs/design/rules.md, "Progress
// without burning the machine").
#pragma once

#include <chrono>

namespace comm::transport {

class ProgressClock {
 public:
  using Clock = std::chrono::steady_clock;
  ProgressClock(int timeout_ms, Clock::duration spin)
      : timeout_(std::chrono::milliseconds(timeout_ms)), spin_(spin) {
    moved();
  }
  // Something moved: the timeout and the spin start again.
  void moved() {
    last_move_ = Clock::now();
    spin_until_ = last_move_ + spin_;
  }
  bool expired(Clock::time_point now) const { return now - last_move_ >= timeout_; }
  bool spinning(Clock::time_point now) const { return now < spin_until_; }
  // How long a blocking wait may sleep now: what is left of the timeout, in whole milliseconds
  // rounded up (a poll of 0 would spin), at most cap_ms (a transport that must look around
  // regularly caps it).
  int block_ms(Clock::time_point now, int cap_ms) const { return ceil_ms(timeout_ - (now - last_move_), cap_ms); }

  static int ceil_ms(Clock::duration d, int cap_ms) {
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(d).count();
    return ms < 1 ? 1 : ms > cap_ms ? cap_ms : static_cast<int>(ms);
  }

 private:
  Clock::duration timeout_, spin_;
  Clock::time_point last_move_, spin_until_;
};

}  // namespace comm::transport

// Chrome/Perfetto trace of the engine's steps and buckets (COMM_TRACE_FILE): spans recorded into
// storage reserved up front (nothing allocated per step), written as JSON once, at destroy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace comm::engine {

class Trace {
 public:
  // Lanes of the picture: the trainer's thread (step, end() blocked, waits for one gradient), the
  // partitions (queued, on the wire; id = partition) and the readiness rounds.
  enum Lane : int { kStep = 0, kEndWait = 1, kBucketQueued = 2, kBucketRun = 3, kRound = 4, kForwardWait = 5 };
  static constexpr int kLanes = 6;

  // path "" = off. %r in path becomes the rank.
  void open(const std::string& path, int rank, size_t max_events = 1 << 16);
  bool on() const { return !path_.empty(); }
  // A span [begin_us, end_us] (steady clock, microseconds); id = step or bucket number.
  void span(Lane lane, int64_t id, uint64_t step, double begin_us, double end_us);
  // Writes the file; returns "" or what went wrong.
  std::string write() const;

 private:
  struct Event {
    Lane lane;
    int64_t id;
    uint64_t step;
    double begin_us, end_us;
  };
  std::string path_;
  int rank_ = 0;
  size_t max_ = 0;
  std::vector<Event> events_;
  size_t dropped_ = 0;
};

}  // namespace comm::engine

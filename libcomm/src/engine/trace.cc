#include "engine/trace.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace comm::engine {

void Trace::open(const std::string& path, int rank, size_t max_events) {
  rank_ = rank;
  path_.clear();
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 1 < path.size() && path[i + 1] == 'r') {
      path_ += std::to_string(rank);
      ++i;
    } else {
      path_ += path[i];
    }
  }
  max_ = max_events;
  if (on()) events_.reserve(max_);
}

void Trace::span(Lane lane, int64_t id, uint64_t step, double begin_us, double end_us) {
  if (!on()) return;
  if (events_.size() >= max_) {
    ++dropped_;  // bounded: a long run keeps its first steps
    return;
  }
  events_.push_back({lane, id, step, begin_us, end_us});
}

std::string Trace::write() const {
  if (!on()) return "";
  FILE* f = std::fopen(path_.c_str(), "we");
  if (f == nullptr) return "cannot write trace file " + path_ + ": " + std::strerror(errno);
  static const char* lane_names[] = {"step",         "end() blocked",      "partition queued", "partition all-reduce",
                                     "readiness round", "comm_engine_wait"};
  std::fprintf(f, "{\"traceEvents\":[\n");
  std::fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}", rank_, rank_);
  for (int l = 0; l < kLanes; ++l)
    std::fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                 rank_, l, lane_names[l]);
  for (const Event& e : events_) {
    const char* what = e.lane == kStep      ? "step"
                       : e.lane == kEndWait ? "end() wait"
                       : e.lane == kRound   ? "round"
                       : e.lane == kForwardWait ? "wait for gradient"
                                            : "partition";
    std::fprintf(f,
                 ",\n{\"name\":\"%s %lld\",\"cat\":\"engine\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
                 "\"dur\":%.3f,\"args\":{\"step\":%llu}}",
                 what, static_cast<long long>(e.id), rank_, static_cast<int>(e.lane), e.begin_us,
                 e.end_us - e.begin_us, static_cast<unsigned long long>(e.step));
  }
  std::fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped_events\":%zu}}\n", dropped_);
  if (std::fclose(f) != 0) return "cannot write trace file " + path_ + ": " + std::strerror(errno);
  return "";
}

}  // namespace comm::engine

// The flight recorder: the last operations of one communicator, for the question "where was
// every rank when the job hung?" (docs/design.md, "The flight recorder").
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "status.h"
#include "transport.h"

namespace comm {

class FlightRecorder {
 public:
  static constexpr size_t kEntries = 256;  // a ring: the oldest is overwritten
  static constexpr size_t kMaxPeers = 8;   // peers kept per failed operation

  // The issuing thread, in issue order: an operation starts and ends. begin returns its slot.
  size_t begin(const transport::OpTag& tag);
  void set_algorithm(size_t slot, const char* name) { entries_[slot].algo.store(name, std::memory_order_relaxed); }
  // failure: the peers the failed wait still waited on (Transport::wait_failure), or null.
  void end(size_t slot, const Status& st, const transport::Transport::WaitFailure* failure);

  // Every recorded operation, oldest first, as JSON. Any thread: an entry being written at
  // that moment may read half old, half new (a diagnostic; never a crash).
  // error: the communicator's failure ("" when healthy), which names the stalled rank (blame.h).
  std::string json(int rank, int size, const std::string& comm_id, const std::string& error) const;

 private:
  enum State : uint8_t { kRunning = 1, kDone = 2, kFailed = 3 };
  struct Entry {
    std::atomic<uint64_t> seq{0}, count{0}, start_ns{0}, end_ns{0};
    std::atomic<uint8_t> coll{0}, dtype{0}, state{0};
    std::atomic<uint32_t> npeers{0};
    std::array<std::atomic<int32_t>, kMaxPeers> peers{};
    std::atomic<const char*> algo{nullptr};
    std::atomic<uint32_t> status{0};
  };
  std::array<Entry, kEntries> entries_;
  std::atomic<uint64_t> next_{0};  // operations begun
};

// Writes the communicator's recorder to `path` (%h host, %p pid, %r rank); an empty path
// means COMM_FLIGHT_RECORDER_FILE, and nothing is written when that is unset too. *written:
// the file written, or empty.
Status dump_flight_recorder(comm_t c, const std::string& path, std::string* written);

}  // namespace comm

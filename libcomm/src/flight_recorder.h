// The flight recorder: the last operations of one communicator, for the question "where was
// every rank when the job hung?" (docs/design/core.md, "The flight recorder").
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
  // Straggler detection (transports/common/arrivals.h): the peer whose first message came last
  // in this operation and this rank's wait for it from the operation's start (-1: none came).
  void set_last_arrival(size_t slot, int peer, uint64_t wait_ns) {
    entries_[slot].last_peer.store(peer, std::memory_order_relaxed);
    entries_[slot].last_wait_ns.store(wait_ns, std::memory_order_relaxed);
  }
  uint64_t start_ns(size_t slot) const { return entries_[slot].start_ns.load(std::memory_order_relaxed); }
  uint64_t end_ns(size_t slot) const { return entries_[slot].end_ns.load(std::memory_order_relaxed); }
  // failure: the peers the failed wait still waited on (Transport::wait_failure), or null.
  void end(size_t slot, const Status& st, const transport::Transport::WaitFailure* failure);

  // Every recorded operation, oldest first, as JSON. Any thread: an entry being written at
  // that moment may read half old, half new (a diagnostic; never a crash).
  // error: the communicator's failure ("" when healthy), which names the stalled rank (blame.h).
  std::string json(int rank, int size, const std::string& comm_id, const std::string& error) const;

  // Where the communicator is now, for a live view (observe/snapshot.cc); any thread.
  struct Now {
    bool running = false;       // an operation has begun and not ended
    uint64_t seq = 0;           // the latest operation's sequence number (0: none yet)
    transport::CollKind coll = transport::CollKind::kInternal;
    uint64_t start_ns = 0;      // wall clock
    uint64_t last_done_seq = 0; // the latest operation that ended (0: none)
    uint64_t operations = 0;    // begun so far
  };
  Now now() const;

 private:
  enum State : uint8_t { kRunning = 1, kDone = 2, kFailed = 3 };
  struct Entry {
    std::atomic<uint64_t> seq{0}, count{0}, start_ns{0}, end_ns{0};
    std::atomic<uint8_t> coll{0}, dtype{0}, state{0};
    std::atomic<uint32_t> npeers{0};
    std::array<std::atomic<int32_t>, kMaxPeers> peers{};
    std::atomic<const char*> algo{nullptr};
    std::atomic<uint32_t> status{0};
    std::atomic<int32_t> last_peer{-1};
    std::atomic<uint64_t> last_wait_ns{0};
  };
  std::array<Entry, kEntries> entries_;
  std::atomic<uint64_t> next_{0};  // operations begun
};

// Writes the communicator's recorder to `path` (%h host, %p pid, %r rank); an empty path
// means COMM_FLIGHT_RECORDER_FILE, and nothing is written when that is unset too. *written:
// the file written, or empty.
Status dump_flight_recorder(comm_t c, const std::string& path, std::string* written);
// A file name pattern with %h (host), %p (pid) and %r (rank) filled in.
std::string expand_file_pattern(const std::string& pattern, int rank);

}  // namespace comm

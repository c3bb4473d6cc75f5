// What one communicator takes from the tuning profile: the entries written for its rank count
// and transport, minus every knob the user set in the environment (API > environment >
// profile > topology plan > default). Built once per communicator; the per-call lookup is a
// scan of a few entries, without allocation.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "tuning/profile.h"

namespace comm::tuning {

// The settings one call gets from one entry (only the knobs the environment left to it).
struct CallTuning {
  const Entry* entry = nullptr;
  CollKind kind = CollKind::kInternal;
  uint64_t min_bytes = 0, max_bytes = 0;
  std::string algo;            // "" = the default rules (algorithms/select.cc)
  size_t chunk_bytes = 0;      // 0 = the communicator's COMM_CHUNK_BYTES
  size_t shm_chunk_bytes = 0;  // 0 = COMM_SHM_CHUNK_BYTES
  std::string applied;         // "algo=ring chunk_bytes=65536", for the log line
  std::string source;          // "tuning profile entry #3 (...)", for fallback messages
  mutable std::atomic<bool> logged{false};  // the INFO line is printed at first use only
};

class Applied {
 public:
  // `transport` is the communicator's: shm (every rank on one host), socket, or shm+socket.
  // `notes` receives one line per entry ignored or trimmed, and why, for the INFO log.
  static std::shared_ptr<const Applied> match(std::shared_ptr<const Profile> profile, int ranks,
                                              const std::string& transport, std::vector<std::string>* notes);

  // The first matching entry for this call's collective and size, or nullptr (defaults).
  const CallTuning* for_call(CollKind kind, uint64_t bytes) const {
    for (const auto& t : calls_)
      if (t->kind == kind && bytes >= t->min_bytes && bytes <= t->max_bytes) return t.get();
    return nullptr;
  }
  // The first engine entry (file order) whose gradient-byte range holds `total_bytes`, or nullptr.
  const Entry* for_engine(uint64_t total_bytes) const {
    for (const Entry* e : engine_)
      if (total_bytes >= e->min_bytes && total_bytes <= e->max_bytes) return e;
    return nullptr;
  }
  size_t engine_entries() const { return engine_.size(); }
  int64_t shm_slot_bytes() const { return shm_slot_bytes_; }  // 0: not set by the profile
  int64_t socket_nconns() const { return socket_nconns_; }
  const std::string& comm_settings() const { return comm_applied_; }
  const Profile& profile() const { return *profile_; }
  size_t call_entries() const { return calls_.size(); }

 private:
  std::shared_ptr<const Profile> profile_;
  std::vector<std::unique_ptr<CallTuning>> calls_;
  std::vector<const Entry*> engine_;  // engine entries for this rank count and transport
  int64_t shm_slot_bytes_ = 0, socket_nconns_ = 0;
  std::string comm_applied_;
};

// A call's size as comm-bench's "size" column and the profile count it: the larger buffer.
uint64_t call_bytes(CollKind kind, size_t count, comm_dtype_t dtype, int nranks);

}  // namespace comm::tuning

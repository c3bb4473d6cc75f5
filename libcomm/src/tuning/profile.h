// The tuning profile comm-tune writes (schema: README.md in this folder): entries of
// (collective, rank count, transport, size range) -> settings of real knobs, with the gain the
// sweep measured. Parsed and validated once, at comm_init, before the rendezvous, so a bad file
// fails every rank at once with a message naming the entry.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "status.h"
#include "transport.h"

namespace comm::tuning {

using transport::CollKind;

// Where a knob acts: on each call (chosen per collective and size), on the whole communicator
// (fixed when its transport is set up), on a gradient engine (its bucket layout, chosen by the
// model's gradient bytes at comm_engine_finalize), or on NCCL (its environment, once per process,
// before NCCL's first init).
enum class Scope { kCall, kCommunicator, kEngine, kNccl };

struct Knob {
  const char* name;    // as written in the profile
  const char* env;     // the environment variable that overrides it (environment > profile)
  Scope scope;
  int64_t min, max;    // integer knobs; algo is a name checked against the algorithm registry
  const char* doc;
};

// Every knob a profile may set; each one is honoured by the runtime (see README.md).
const std::vector<Knob>& knobs();
const Knob* find_knob(const std::string& name);
// NCCL's knobs a profile may set (transport "nccl"); the same table comm-tune validates with.
const std::vector<Knob>& nccl_knobs();

struct Settings {
  std::string algo;                     // "" = not set
  int64_t chunk_bytes = 0;              // 0 = not set (every integer knob)
  int64_t shm_chunk_bytes = 0;
  int64_t shm_slot_bytes = 0;
  int64_t socket_nconns = 0;
  int64_t bucket_cap_bytes = 0;         // engine entries
  int64_t first_bucket_bytes = 0;
  std::vector<std::pair<std::string, std::string>> nccl;  // NCCL_* name, value (nccl entries)
  std::string describe() const;         // "algo=ring chunk_bytes=65536"
  bool empty() const { return describe().empty(); }
};

struct Entry {
  int index = 0;                        // position in "entries", for messages ("entry #3")
  std::string collective;               // allreduce ... alltoall, "*" (communicator or NCCL knobs), "engine"
  CollKind kind = CollKind::kInternal;  // kInternal for "*"
  int ranks = 0;
  std::string transport;                // shm, socket, ucx, shm+socket, shm+ucx, socket+ucx; nccl
  uint64_t min_bytes = 0, max_bytes = UINT64_MAX;  // inclusive: a call's comm-bench "size", or an
                                                   // engine's gradient bytes (every parameter)
  Settings settings;
  double gain = 0;                      // measured busbw / default busbw (informational)
  std::string label() const;            // "entry #3 (allreduce, 4 ranks, shm, 1048576..4194304 bytes)"
  bool is_engine() const { return collective == "engine"; }
  bool is_nccl() const { return transport == "nccl"; }
};

struct Profile {
  std::string path;
  std::string hash;  // FNV-1a of the file's bytes: every rank must load the same profile
  std::vector<Entry> entries;
};

// Parses and validates `text` (read from `path`). Errors are INVALID_ARGUMENT naming the file
// and the entry: not JSON, unknown knob, value out of range, unknown algorithm for the
// collective, a communicator knob in a per-collective entry.
Status parse_profile(const std::string& path, const std::string& text, Profile* out);

// COMM_TUNING_FILE: nullptr profile and hash "none" when unset; else the file, parsed.
Status load_from_env(std::shared_ptr<const Profile>* out, std::string* hash);

}  // namespace comm::tuning

// A POSIX shared-memory segment: created (and unlinked) by its owner, mapped by every local
// rank. Names carry the job secret, so two jobs never meet; the owner unlinks as soon as every
// local rank has mapped it, so a crash leaves nothing in /dev/shm.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "status.h"

namespace comm::transport::shm {

class Segment {
 public:
  Segment() = default;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  Segment(Segment&& other) noexcept { *this = std::move(other); }
  Segment& operator=(Segment&& other) noexcept;
  ~Segment();

  // Creates `name` with `bytes` (sparse: nothing allocated until written or fallocate()d) and
  // maps it. `populate`: prefault every page now (small segments: no first touch later).
  static Status create(const std::string& name, size_t bytes, bool populate, Segment* out);
  // Maps a peer's segment; its size is whatever the owner made it.
  static Status open(const std::string& name, bool populate, Segment* out);

  // Removes the name (the owner, once every local rank has mapped it). Idempotent.
  void unlink();

  char* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  int fd() const { return fd_; }  // the owner keeps it (fallocate on its arena)
  const std::string& name() const { return name_; }

 private:
  void reset();

  std::string name_;
  char* base_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
  bool owner_linked_ = false;  // created here and not unlinked yet
};

// "/comm-<16 hex of the secret>-<comm id>-<rank><kind>": unique per job, communicator and rank.
std::string segment_name(const std::string& secret, const std::string& comm_id, int rank, char kind);

// Inode of this process's pid namespace (0 if unknown).
uint64_t pid_namespace();

// Unlinks libcomm segments in /dev/shm whose owner, in this pid namespace, is gone: a rank
// killed between creating its segments and the barrier after which they are unlinked (the
// owner is written first, by create()). Live owners' segments and other namespaces' are left
// alone; a "comm-" segment with no owner at all is removed once unchanged for
// `unclaimed_age`. Returns how many were removed.
int remove_orphans(std::chrono::seconds unclaimed_age = std::chrono::seconds(60));

}  // namespace comm::transport::shm

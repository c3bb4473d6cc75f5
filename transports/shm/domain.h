// What the ranks of one host share for the whole job (the world communicator and every
// communicator derived from it): each local rank's arena -- a large, sparse shared-memory
// segment that every local rank maps at init -- and a handle on each local rank's process.
//
// comm_mem_alloc carves buffers from this rank's arena, so a local peer reads them in place
// through its own mapping; shared staging for buffers peers cannot reach is carved there too.
// The arena is reserved, not allocated: pages exist only once fallocate()d by an allocation.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "deadline.h"
#include "status.h"
#include "store/store.h"
#include "shm/segment.h"
#include "transport.h"

namespace comm::transport::shm {

struct DomainConfig {
  std::string secret;
  int world_rank = 0;
  std::vector<int> local_world_ranks;  // world ranks on this host, ascending (this one included)
  size_t arena_bytes = size_t{64} << 30;
  bool cma_allowed = true;  // COMM_SHM_CMA
  std::string label;        // for log lines
};

class Domain : public JobMemory, public std::enable_shared_from_this<Domain> {
 public:
  Domain() = default;
  Domain(const Domain&) = delete;
  Domain& operator=(const Domain&) = delete;
  ~Domain() override;

  // Creates this rank's arena and publishes it in `store` (the world's).
  static Status create(const DomainConfig& config, Store& store, std::shared_ptr<Domain>* out);
  // Maps every local peer's arena (waiting for it in the store), opens a handle on its process
  // and tries process_vm_readv on it once. Call after every local rank's create().
  Status map_peers(Store& store, Deadline deadline);
  // Once every local rank has mapped it (a store barrier): the name goes, the memory stays.
  void unlink_own() { own_.unlink(); }

  // Whether process_vm_readv worked on every local peer here (cma_probe_ok) and, after the
  // job-wide agreement, whether it is used (set_cma).
  bool cma_probe_ok() const { return cma_probe_ok_; }
  void set_cma(bool on) { cma_ = on; }
  bool cma() const { return cma_; }

  int local_size() const { return static_cast<int>(peers_.size()); }
  int my_index() const { return my_index_; }
  // Index of a world rank among the local ones, -1 if it is not on this host.
  int index_of_world(int world_rank) const;
  pid_t pid(int index) const { return peers_[static_cast<size_t>(index)].pid; }
  const char* arena(int index) const { return peers_[static_cast<size_t>(index)].base; }
  size_t arena_bytes(int index) const { return peers_[static_cast<size_t>(index)].bytes; }
  char* own_arena() const { return own_.base(); }

  // True when the local rank's process has exited (or cannot be watched: then false).
  bool exited(int index) const;
  // process_vm_readv of `len` bytes at `remote` in local rank `index`'s process.
  Status cma_read(int index, uint64_t remote, void* dst, size_t len) const;

  // Allocations in this rank's arena: page-granular, backed (fallocate) and prefaulted here.
  // SYSTEM when the arena or /dev/shm is full.
  // While a domain has live allocations it outlives its communicators (buffers stay valid
  // until comm_mem_free); owner_of() finds the domain of any such buffer.
  Status alloc(size_t bytes, char** out);
  void free(const void* p);
  bool owns(const void* p) const;
  static std::shared_ptr<Domain> owner_of(const void* p);
  // JobMemory: comm_mem_alloc / comm_mem_free. release() frees a buffer of any domain of this
  // process (a communicator may be destroyed before the buffers made through it).
  Status allocate(size_t bytes, void** out) override {
    char* p = nullptr;
    Status st = alloc(bytes, &p);
    *out = p;
    return st;
  }
  bool release(void* p) override {
    auto owner = owner_of(p);
    if (owner) owner->free(p);
    return owner != nullptr;
  }
  // Offset of [p, p + len) in this rank's arena, false if it is not inside one allocation's reach.
  bool locate(const void* p, size_t len, uint64_t* offset) const;

 private:
  struct Peer {
    Segment mapping;  // peers' arenas (ours is own_)
    const char* base = nullptr;
    size_t bytes = 0;
    pid_t pid = 0;
    int pidfd = -1;  // -1: not watched (this process, or another pid namespace)
    uint64_t self_address = 0;
  };

  DomainConfig config_;
  Segment own_;
  std::vector<Peer> peers_;
  int my_index_ = 0;
  bool cma_probe_ok_ = false;
  bool cma_ = false;

  mutable std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced
  std::map<size_t, size_t> used_;  // offset -> bytes
};

}  // namespace comm::transport::shm

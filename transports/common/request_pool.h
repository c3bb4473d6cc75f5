// Every transport's requests: a fixed pool, allocated and touched once at setup so that posting
// never allocates, with ids that carry a generation, so a stale or repeated id is refused instead
// of completing someone else's request. R is the transport's own request; the pool keeps the
// bookkeeping (active, generation, free list) beside it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "status.h"
#include "transport.h"

namespace comm::transport {

template <class R, uint32_t kBits>
class RequestPool {
 public:
  static constexpr uint32_t kSize = 1u << kBits;  // requests in flight at once

  explicit RequestPool(const char* transport) : transport_(transport), slots_(kSize) {
    for (uint32_t i = 0; i < kSize; ++i) slots_[i].next_free = i + 1 < kSize ? i + 1 : kNone;
  }

  R& operator[](uint32_t index) { return slots_[index].request; }
  const R& operator[](uint32_t index) const { return slots_[index].request; }
  static uint32_t index_of(RequestId id) { return id & (kSize - 1); }
  R& of(RequestId id) { return slots_[index_of(id)].request; }  // an id lookup() accepted
  const R& of(RequestId id) const { return slots_[index_of(id)].request; }
  bool active(uint32_t index) const { return slots_[index].active; }

  // A free slot, active from now on; its request keeps what the last user left (reset it).
  Status acquire(uint32_t* index, RequestId* id) {
    if (free_head_ == kNone)
      return Internal(std::string(transport_) + " transport: all " + std::to_string(kSize) +
                      " request slots are in use; every isend/irecv must be completed by wait() or test() "
                      "(are requests leaking?)");
    *index = free_head_;
    Slot& s = slots_[*index];
    free_head_ = s.next_free;
    s.active = true;
    *id = (s.generation << kBits) | *index;
    return Status::Ok();
  }

  Status lookup(RequestId id, uint32_t* index) const {
    const uint32_t i = index_of(id);
    const Slot& s = slots_[i];
    if (!s.active || s.generation != (id >> kBits))
      return InvalidArgument(std::string(transport_) + " transport: request id " + std::to_string(id) +
                             " is unknown or already completed");
    *index = i;
    return Status::Ok();
  }

  // A wait's list: every id must be live.
  Status lookup_all(const RequestId* ids, size_t n) const {
    if (n > 0 && ids == nullptr) return InvalidArgument(std::string(transport_) + " transport: null request id list");
    uint32_t index;
    for (size_t i = 0; i < n; ++i) COMM_RETURN_IF_ERROR(lookup(ids[i], &index));
    return Status::Ok();
  }

  // False when the slot was free already (the same id listed twice in one wait).
  bool release(uint32_t index) {
    Slot& s = slots_[index];
    if (!s.active) return false;
    s.active = false;
    s.generation = (s.generation + 1) & kGenerationMask;
    if (s.generation == 0) s.generation = 1;
    s.next_free = free_head_;
    free_head_ = index;
    return true;
  }
  void release_all(const RequestId* ids, size_t n) {
    for (size_t i = 0; i < n; ++i) release(index_of(ids[i]));
  }

 private:
  static constexpr uint32_t kNone = ~0u;
  static constexpr uint32_t kGenerationMask = (1u << (32 - kBits)) - 1;
  struct Slot {
    R request;
    uint32_t generation = 1;  // in the RequestId, so a stale id is caught
    uint32_t next_free = kNone;
    bool active = false;
  };
  const char* transport_;
  std::vector<Slot> slots_;
  uint32_t free_head_ = 0;
};

}  // namespace comm::transport

#include "algorithms/scratch.h"

#include <bit>
#include <cstdlib>
#include <cstring>

namespace comm::algo {

namespace {
constexpr size_t kMinBytes = size_t{64} << 10;
constexpr size_t kAlign = 64;
}  // namespace

Scratch::~Scratch() {
  for (void* p : buf_) std::free(p);
}

void* Scratch::get(size_t bytes, int slot) {
  if (slot < 0 || slot >= kSlots) return nullptr;
  if (buf_[slot] != nullptr && bytes <= cap_[slot]) return buf_[slot];
  // Size classes are powers of two so a slowly growing message size regrows a few times, not
  // every call; the memset is the one first touch this memory ever gets.
  size_t want = bytes < kMinBytes ? kMinBytes : bytes;
  if (want > (SIZE_MAX >> 1)) return nullptr;
  want = std::bit_ceil(want);
  void* p = std::aligned_alloc(kAlign, want);
  if (p == nullptr) return nullptr;
  std::memset(p, 0, want);
  std::free(buf_[slot]);
  buf_[slot] = p;
  cap_[slot] = want;
  return p;
}

}  // namespace comm::algo

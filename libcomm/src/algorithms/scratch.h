// Staging memory for algorithms: grown by size class, touched once on growth, reused
// forever (a first touch here is ~50x slower than reuse; docs/design/rules.md, "No allocation on the hot path").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace comm::algo {

class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch();
  // A buffer of at least `bytes`, 64-byte aligned, valid until the next call with a larger size.
  // Slot s (0..3) gives independent buffers for algorithms that need more than one.
  void* get(size_t bytes, int slot = 0);

 private:
  static constexpr int kSlots = 4;
  void* buf_[kSlots] = {};
  size_t cap_[kSlots] = {};
};

}  // namespace comm::algo

// FNV-1a, 64-bit: the one stable hash every floor uses where ranks (or builds) must compute the
// same value from the same bytes -- the job's derived port, the tuning profile's hash, the UCX
// header key. Not a cryptographic hash: it tells honest mistakes apart, it keeps no secret.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace comm {

inline uint64_t fnv1a(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

inline uint64_t fnv1a(std::string_view text) { return fnv1a(text.data(), text.size()); }

}  // namespace comm

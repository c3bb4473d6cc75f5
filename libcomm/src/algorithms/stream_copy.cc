#include "algorithms/stream_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "log.h"
#include "params.h"

namespace comm::algo {

void copy_bytes_streaming(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  if (bytes < 1024) {
    std::memcpy(d, s, bytes);
    return;
  }
  // Align the destination to 16 bytes (SSE2 is in every x86-64, and 16-byte streaming stores
  // already fill whole lines through the write-combining buffers).
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  const size_t blocks = bytes / 64;
  for (size_t i = 0; i < blocks; ++i, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, bytes % 64);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void streaming_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

// Half the last-level cache: from there on the input and the output of a rank no longer both
// fit in its share of the cache, so the output's lines would be evicted before any reuse anyway.
// (sysfs, as lscpu reads it: in a VM, sysconf's _SC_LEVEL3_CACHE_SIZE may report the host's.)
static size_t auto_threshold() {
  size_t l3 = 0;
  if (FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {
    unsigned long long v = 0;
    char unit = 0;
    if (std::fscanf(f, "%llu%c", &v, &unit) >= 1)
      l3 = static_cast<size_t>(v) * (unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : 1);
    std::fclose(f);
  }
  return l3 > 0 ? std::max<size_t>(l3 / 2, size_t{1} << 20) : size_t{16} << 20;
}

size_t streaming_threshold_bytes() {
  static const size_t value = [] {
    const int64_t v = params::int_or_default("COMM_SHM_STREAM_BYTES", log::kAlg);
    const size_t bytes = v < 0 ? auto_threshold() : static_cast<size_t>(v);
    COMM_INFO(kAlg, "shared memory: ordinary all-reduce outputs of %zu bytes and more are written with streaming "
               "stores (COMM_SHM_STREAM_BYTES=%lld, -1 = half the L3 cache)", bytes, static_cast<long long>(v));
    return bytes;
  }();
  return value;
}

}  // namespace comm::algo

// Copies that bypass the cache for the destination (non-temporal stores), for results written
// into a caller's large ordinary buffer that nobody reads again during the call. A normal store
// first reads the destination line (read-for-ownership), so a memory-bound copy moves 3 bytes per
// byte copied; streaming stores move 2. Only worth it when the buffer is larger than the caches
// (below that the caller reads its result from cache): see streaming_threshold_bytes().
#pragma once

#include <cstddef>

namespace comm::algo {

// dst and src must not overlap. Falls back to memcpy off x86-64 and for short copies.
void copy_bytes_streaming(void* dst, const void* src, size_t bytes);

// Streaming stores are ordered with a fence before anything that publishes their data.
void streaming_fence();

// COMM_SHM_STREAM_BYTES (default -1: half the L3 cache): an out-of-place call whose buffer is at
// least this large writes its ordinary output with streaming stores; 0 = always, a huge value = never.
// In place they would only lose: the output's lines were just read, so a normal store needs no
// read-for-ownership, and streaming would evict what the next call reads.
size_t streaming_threshold_bytes();

}  // namespace comm::algo

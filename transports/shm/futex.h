// FUTEX_WAIT / FUTEX_WAKE on a word in shared memory (not FUTEX_PRIVATE: the waker may be
// another process). Waits always carry a timeout: callers check abort, peers and deadlines
// between slices.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

namespace comm::transport::shm {

// Sleeps while *word == expected, at most `ns` nanoseconds (spurious wake-ups are fine).
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, long ns) {
  timespec rel{ns / 1000000000L, ns % 1000000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &rel, nullptr, 0);
}

inline void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace comm::transport::shm

#include "posix/fork_generation.h"

#include <pthread.h>

#include <atomic>
#include <mutex>

namespace comm::posix {
namespace {

std::atomic<uint64_t> generation{0};

void in_child() { generation.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

uint64_t fork_generation() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, &in_child); });
  return generation.load(std::memory_order_relaxed);
}

}  // namespace comm::posix

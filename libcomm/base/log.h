// Levelled, subsystem-filtered logging (NCCL's NCCL_DEBUG / NCCL_DEBUG_SUBSYS model).
// COMM_DEBUG=WARN (default) | INFO | TRACE; COMM_DEBUG_SUBSYS=INIT,NET,COLL,STORE,ENV,ALG,ALL
// (a leading ^ excludes). A disabled log line costs one relaxed atomic load.
#pragma once

#include <atomic>
#include <cstdint>

namespace comm::log {

enum class Level : int { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

enum Subsys : uint32_t {
  kInit = 1u << 0,
  kNet = 1u << 1,
  kColl = 1u << 2,
  kStore = 1u << 3,
  kEnv = 1u << 4,
  kAlg = 1u << 5,
  kAll = 0xffffffffu,
};

// Current threshold and mask; initialised from the environment on first use.
extern std::atomic<int> g_level;
extern std::atomic<uint32_t> g_subsys;
void init_from_env();

inline bool enabled(Level level, uint32_t subsys) {
  int current = g_level.load(std::memory_order_relaxed);
  if (current < 0) {
    init_from_env();
    current = g_level.load(std::memory_order_relaxed);
  }
  return static_cast<int>(level) <= current && (g_subsys.load(std::memory_order_relaxed) & subsys);
}

// Prints "hostname:pid:tid [rank] LEVEL SUBSYS message" to stderr in one write().
void write(Level level, uint32_t subsys, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

// The rank this thread logs as (set by the communicator), -1 before init.
void set_thread_rank(int rank);

}  // namespace comm::log

#define COMM_LOG(level, subsys, ...)                                               \
  do {                                                                             \
    if (::comm::log::enabled(::comm::log::Level::level, ::comm::log::subsys))      \
      ::comm::log::write(::comm::log::Level::level, ::comm::log::subsys, __VA_ARGS__); \
  } while (0)
#define COMM_WARN(subsys, ...) COMM_LOG(kWarn, subsys, __VA_ARGS__)
#define COMM_INFO(subsys, ...) COMM_LOG(kInfo, subsys, __VA_ARGS__)
#define COMM_TRACE(subsys, ...) COMM_LOG(kTrace, subsys, __VA_ARGS__)

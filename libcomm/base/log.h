// Levelled, subsystem-filtered logging (NCCL's NCCL_DEBUG / NCCL_DEBUG_SUBSYS / NCCL_DEBUG_FILE model).
// COMM_DEBUG=NONE | WARN (default) | VERSION | INFO | TRACE, each showing the ones before it;
// COMM_DEBUG_SUBSYS=INIT,NET,COLL,STORE,ENV,ALG,ALL (a leading ^ excludes) filters INFO and TRACE:
// warnings and the version line always pass, as NCCL logs them for every subsystem.
// COMM_DEBUG_FILE=PATH sends the lines there instead of stderr; %h, %p and %r in PATH become the
// host name, the pid and the rank. A disabled log line costs one relaxed atomic load.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace comm::log {

// VERSION sits above WARN (unlike NCCL, where it is below) so that the default, WARN, stays silent
// on a healthy run.
enum class Level : int { kNone = 0, kWarn = 1, kVersion = 2, kInfo = 3, kTrace = 4 };

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
  return static_cast<int>(level) <= current &&
         (level <= Level::kVersion || (g_subsys.load(std::memory_order_relaxed) & subsys) != 0);
}

// Prints "hostname:pid:tid [rank] libcomm LEVEL SUBSYS message" to stderr (or COMM_DEBUG_FILE) in
// one write().
void write(Level level, uint32_t subsys, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

// The rank this thread logs as (set by the communicator), -1 before init.
void set_thread_rank(int rank);

// COMM_DEBUG_FILE's path for this process: %h host, %p pid, %r rank, %% '%' (NCCL_DEBUG_FILE's
// syntax plus %r). Exposed for tests.
std::string expand_debug_file(const std::string& pattern, const std::string& host, int pid, const std::string& rank);

}  // namespace comm::log

#define COMM_LOG(level, subsys, ...)                                               \
  do {                                                                             \
    if (::comm::log::enabled(::comm::log::Level::level, ::comm::log::subsys))      \
      ::comm::log::write(::comm::log::Level::level, ::comm::log::subsys, __VA_ARGS__); \
  } while (0)
#define COMM_WARN(subsys, ...) COMM_LOG(kWarn, subsys, __VA_ARGS__)
#define COMM_VERSION(subsys, ...) COMM_LOG(kVersion, subsys, __VA_ARGS__)
#define COMM_INFO(subsys, ...) COMM_LOG(kInfo, subsys, __VA_ARGS__)
#define COMM_TRACE(subsys, ...) COMM_LOG(kTrace, subsys, __VA_ARGS__)

#include "log.h"

#include <unistd.h>
#include <sys/syscall.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "params.h"

namespace comm::log {

std::atomic<int> g_level{-1};
std::atomic<uint32_t> g_subsys{kAll};

namespace {

thread_local int t_rank = -1;

uint32_t subsys_bit(const std::string& name) {
  if (name == "INIT") return kInit;
  if (name == "NET") return kNet;
  if (name == "COLL") return kColl;
  if (name == "STORE") return kStore;
  if (name == "ENV") return kEnv;
  if (name == "ALG") return kAlg;
  if (name == "ALL") return kAll;
  return 0;
}

const char* level_name(Level l) {
  switch (l) {
    case Level::kWarn: return "WARN";
    case Level::kInfo: return "INFO";
    case Level::kTrace: return "TRACE";
    default: return "";
  }
}

const char* subsys_name(uint32_t s) {
  switch (s) {
    case kInit: return "INIT";
    case kNet: return "NET";
    case kColl: return "COLL";
    case kStore: return "STORE";
    case kEnv: return "ENV";
    case kAlg: return "ALG";
    default: return "ALL";
  }
}

}  // namespace

void init_from_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    int level = static_cast<int>(Level::kWarn);
    std::string value;
    if (params::get_string("COMM_DEBUG", &value).ok()) {
      for (auto& c : value) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
      if (value == "NONE") level = 0;
      else if (value == "WARN") level = 1;
      else if (value == "INFO") level = 2;
      else if (value == "TRACE") level = 3;
    }
    uint32_t mask = kAll;
    std::string subsys;
    if (params::get_string("COMM_DEBUG_SUBSYS", &subsys).ok() && !subsys.empty()) {
      bool exclude = subsys[0] == '^';
      if (exclude) subsys.erase(0, 1);
      uint32_t listed = 0;
      size_t start = 0;
      while (start <= subsys.size()) {
        size_t comma = subsys.find(',', start);
        if (comma == std::string::npos) comma = subsys.size();
        std::string item = subsys.substr(start, comma - start);
        for (auto& c : item) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
        listed |= subsys_bit(item);
        start = comma + 1;
      }
      mask = exclude ? (kAll & ~listed) : listed;
    }
    g_subsys.store(mask, std::memory_order_relaxed);
    g_level.store(level, std::memory_order_relaxed);
  });
}

void set_thread_rank(int rank) { t_rank = rank; }

void write(Level level, uint32_t subsys, const char* fmt, ...) {
  static char host[64] = {};
  if (host[0] == 0) gethostname(host, sizeof host - 1);
  char line[2048];
  int n = snprintf(line, sizeof line, "%s:%d:%ld [%d] libcomm %s %s ", host, getpid(),
                   static_cast<long>(syscall(SYS_gettid)), t_rank, level_name(level), subsys_name(subsys));
  if (n < 0) return;
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - static_cast<size_t>(n) - 1, fmt, ap);
  va_end(ap);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : static_cast<size_t>(m));
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  // One write() so lines from ranks and threads do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, line, len);
  (void)ignored;
}

}  // namespace comm::log

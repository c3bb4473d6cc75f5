#include "log.h"

#include <fcntl.h>
#include <unistd.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "params.h"

namespace comm::log {

std::atomic<int> g_level{-1};
std::atomic<uint32_t> g_subsys{kAll};

namespace {

thread_local int t_rank = -1;

// Where lines go: stderr, or the COMM_DEBUG_FILE opened at the first line (so that its %r can
// be the rank of the thread that logs first).
std::atomic<int> g_fd{-1};
std::once_flag g_file_once;

constexpr const char* kSubsysNames = "INIT,NET,COLL,STORE,ENV,ALG,ALL";

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
    case Level::kVersion: return "VERSION";
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

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  return s;
}

// Before the communicator names the rank, the launcher's variable does (the same ones
// libcomm/base/rendezvous.cc reads); "-1" when none is set.
std::string rank_text() {
  if (t_rank >= 0) return std::to_string(t_rank);
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"})
    if (auto v = params::env(name)) return *v;
  return "-1";
}

}  // namespace

// NCCL_DEBUG_FILE's syntax: %h host, %p pid, and %r rank (libcomm's); %% is a '%'.
std::string expand_debug_file(const std::string& pattern, const std::string& host, int pid, const std::string& rank) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    switch (pattern[++i]) {
      case 'h': out += host; break;
      case 'p': out += std::to_string(pid); break;
      case 'r': out += rank; break;
      case '%': out += '%'; break;
      default:
        out += '%';
        out += pattern[i];
    }
  }
  return out;
}

namespace {

char* host_name() {
  static char host[64] = {};
  if (host[0] == 0) gethostname(host, sizeof host - 1);
  return host;
}

int log_fd() {
  std::call_once(g_file_once, [] {
    std::string pattern;
    if (!params::get_string("COMM_DEBUG_FILE", &pattern).ok() || pattern.empty()) return;
    const std::string path = expand_debug_file(pattern, host_name(), getpid(), rank_text());
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      const std::string msg = std::string(host_name()) + ":" + std::to_string(getpid()) +
                              " libcomm WARN ENV COMM_DEBUG_FILE: cannot open " + path + ": " + std::strerror(errno) +
                              "; logging to stderr\n";
      ssize_t ignored = ::write(STDERR_FILENO, msg.data(), msg.size());
      (void)ignored;
      return;
    }
    g_fd.store(fd, std::memory_order_release);
  });
  const int fd = g_fd.load(std::memory_order_acquire);
  return fd >= 0 ? fd : STDERR_FILENO;
}

}  // namespace

void init_from_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::string problems;  // warned once the level is set, so they are seen
    int level = static_cast<int>(Level::kWarn);
    if (auto raw = params::env("COMM_DEBUG")) {
      const std::string value = upper(*raw);
      if (value == "NONE") level = static_cast<int>(Level::kNone);
      else if (value == "WARN") level = static_cast<int>(Level::kWarn);
      else if (value == "VERSION") level = static_cast<int>(Level::kVersion);
      else if (value == "INFO") level = static_cast<int>(Level::kInfo);
      else if (value == "TRACE") level = static_cast<int>(Level::kTrace);
      else problems += "COMM_DEBUG='" + *raw + "' is not one of NONE, WARN, VERSION, INFO, TRACE; using WARN\n";
    }
    uint32_t mask = kAll;
    std::string subsys;
    if (params::get_string("COMM_DEBUG_SUBSYS", &subsys).ok() && !subsys.empty()) {
      bool exclude = subsys[0] == '^';
      if (exclude) subsys.erase(0, 1);
      uint32_t listed = 0;
      std::string unknown;
      size_t start = 0;
      while (start <= subsys.size()) {
        size_t comma = subsys.find(',', start);
        if (comma == std::string::npos) comma = subsys.size();
        const std::string item = upper(subsys.substr(start, comma - start));
        const uint32_t bit = subsys_bit(item);
        if (bit == 0 && !item.empty()) unknown += (unknown.empty() ? "'" : ", '") + item + "'";
        listed |= bit;
        start = comma + 1;
      }
      // Unknown names are left out; a list with no known name would log nothing at all.
      mask = exclude ? (kAll & ~listed) : (listed != 0 ? listed : kAll);
      if (!unknown.empty())
        problems += "COMM_DEBUG_SUBSYS: unknown subsystem " + unknown + " ignored (known: " + kSubsysNames + ")" +
                    (!exclude && listed == 0 ? "; logging every subsystem" : "") + "\n";
    }
    g_subsys.store(mask, std::memory_order_relaxed);
    g_level.store(level, std::memory_order_relaxed);
    for (size_t start = 0; start < problems.size();) {
      const size_t nl = problems.find('\n', start);
      if (level >= static_cast<int>(Level::kWarn))
        write(Level::kWarn, kEnv, "%s", problems.substr(start, nl - start).c_str());
      start = nl + 1;
    }
  });
}

void set_thread_rank(int rank) { t_rank = rank; }

void write(Level level, uint32_t subsys, const char* fmt, ...) {
  char line[2048];
  int n = snprintf(line, sizeof line, "%s:%d:%ld [%d] libcomm %s %s ", host_name(), getpid(),
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
  ssize_t ignored = ::write(log_fd(), line, len);
  (void)ignored;
}

}  // namespace comm::log

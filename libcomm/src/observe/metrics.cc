// Opening the metrics plugin and telling Prometheus where it listens (metrics.h).
#include "observe/metrics.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <string>

#include "flight_recorder.h"
#include "log.h"
#include "observe/endpoints.h"
#include "observe/metrics_plugin.h"
#include "params.h"

namespace comm::observe {
namespace {

struct Plugin {
  comm_metrics_write_fn write = nullptr;  // null: not running
};
Plugin& plugin() {
  static Plugin p;
  return p;
}
const comm_metrics_host kHost = {COMM_METRICS_PLUGIN_VERSION, &snapshot};

// "host:port", "[v6]:port", ":port" or "port"; the host defaults to 127.0.0.1.
bool parse_address(const std::string& text, std::string* host, int* port) {
  std::string p = text;
  *host = "127.0.0.1";
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') return false;
    *host = text.substr(1, close - 1);
    p = text.substr(close + 2);
  } else if (const size_t colon = text.rfind(':'); colon != std::string::npos) {
    if (colon > 0) *host = text.substr(0, colon);
    p = text.substr(colon + 1);
  }
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) return false;
  *port = std::stoi(p);
  return *port <= 65535;
}

// This rank's index among the communicator's ranks on its host: local rank L listens on port + L.
int local_index(comm_t c) {
  int n = 0;
  const int mine = c->host_of.empty() ? 0 : c->host_of[static_cast<size_t>(c->rank)];
  for (int r = 0; r < c->rank && !c->host_of.empty(); ++r)
    if (c->host_of[static_cast<size_t>(r)] == mine) ++n;
  return n;
}

// Beside libcomm.so itself first (an installed or built tree keeps them together), then the
// loader's search path; COMM_METRICS_PLUGIN names the file outright.
void* open_plugin(std::string* tried) {
  std::string path;
  (void)params::get_string("COMM_METRICS_PLUGIN", &path);
  if (path.empty()) {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&start_metrics), &info) != 0 && info.dli_fname != nullptr) {
      std::string self = info.dli_fname;
      const size_t slash = self.rfind('/');
      if (slash != std::string::npos) {
        path = self.substr(0, slash + 1) + "libcomm_metrics.so";
        if (access(path.c_str(), R_OK) != 0) path.clear();
      }
    }
  }
  if (path.empty()) path = "libcomm_metrics.so";
  *tried = path;
  return dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
}

// Prometheus's file-based service discovery: one target group, written whole (rename); and the
// job's store (publish_endpoint).
void publish_endpoint(comm_t c, const std::string& target, const std::string& hostname);
void write_targets(comm_t c, const std::string& host, int port) {
  char name[256] = "";
  gethostname(name, sizeof name - 1);
  for (char* ch = name; *ch; ++ch)
    if (*ch == '"' || *ch == '\\' || static_cast<unsigned char>(*ch) < 0x20) *ch = '?';
  const bool any = host == "0.0.0.0" || host == "::" || host.empty();
  const std::string target = (any ? std::string(name) : host.find(':') != std::string::npos ? "[" + host + "]" : host) +
                             ":" + std::to_string(port);
  publish_endpoint(c, target, name);
  std::string pattern;
  if (!params::get_string("COMM_METRICS_FILE", &pattern).ok() || pattern.empty()) return;
  const std::string file = expand_file_pattern(pattern, c->rank);
  // libcomm_rank, not rank: the page's own rank label (per communicator) stays as it is.
  const std::string text = "[{\"targets\": [\"" + target + "\"], \"labels\": {\"libcomm_host\": \"" + name +
                           "\", \"libcomm_rank\": \"" + std::to_string(c->rank) + "\"}}]\n";
  const std::string tmp = file + ".tmp" + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f != nullptr && std::fclose(f) != 0) ok = false;
  if (ok && std::rename(tmp.c_str(), file.c_str()) == 0) return;
  std::remove(tmp.c_str());
  COMM_WARN(kInit, "rank %d: cannot write COMM_METRICS_FILE %s (%s); the metrics are on %s", c->rank, file.c_str(),
            errno_string(errno).c_str(), target.c_str());
}

// The job's store, while it lives, lists every rank's endpoint, so comm-top finds the ranks without
// a shared filesystem (`comm-top --store`, tools/comm-top/comm_top_store.cc, which proves
// COMM_AUTH_TOKEN as the ranks do): a slot from a counter, then "RANK TARGET HOSTNAME" in it. Only
// where the metrics listen; a store that does not answer costs a warning, never the job.
void publish_endpoint(comm_t c, const std::string& target, const std::string& hostname) {
  if (!c->job_store) return;
  int64_t slot = 0;
  Status st = c->job_store->add(std::string(kEndpointCounter), 1, &slot);
  if (st.ok())
    st = c->job_store->set(std::string(kEndpointPrefix) + std::to_string(slot - 1),
                           std::to_string(c->rank) + " " + target + " " + hostname, Deadline::after_ms(5000));
  c->job_store->release_idle();  // rank 0's store holds no connection per rank (docs/design/transports.md, "Connections")
  if (!st.ok())
    COMM_WARN(kInit, "rank %d: the metrics endpoint %s is not in the job's store (%s); comm-top finds it through "
              "COMM_METRICS_FILE instead", c->rank, target.c_str(), st.message().c_str());
}

}  // namespace

void start_metrics(comm_t c) {
  static std::once_flag once;
  std::call_once(once, [c] {
    std::string addr, textfile;
    (void)params::get_string("COMM_METRICS_ADDR", &addr);
    (void)params::get_string("COMM_METRICS_TEXTFILE", &textfile);
    if (addr.empty() && textfile.empty()) return;  // nothing listens, nothing is opened, unless asked
    std::string host;
    int base = 0;
    if (!addr.empty() && !parse_address(addr, &host, &base)) {
      COMM_WARN(kInit, "rank %d: COMM_METRICS_ADDR=%s is not host:port (e.g. 127.0.0.1:9400, :9400, [::1]:9400); "
                "no metrics are served", c->rank, addr.c_str());
      addr.clear();
    }
    std::string tried;
    void* lib = open_plugin(&tried);
    auto start = lib ? reinterpret_cast<comm_metrics_start_fn>(dlsym(lib, COMM_METRICS_START_SYMBOL)) : nullptr;
    auto write = lib ? reinterpret_cast<comm_metrics_write_fn>(dlsym(lib, COMM_METRICS_WRITE_SYMBOL)) : nullptr;
    if (start == nullptr || write == nullptr) {
      const char* err = dlerror();
      COMM_WARN(kInit, "rank %d: COMM_METRICS_%s is set but the metrics plugin %s cannot be opened (%s); no metrics: "
                "install libcomm_metrics.so beside libcomm.so, or name it with COMM_METRICS_PLUGIN",
                c->rank, addr.empty() ? "TEXTFILE" : "ADDR", tried.c_str(), err != nullptr ? err : "its entry points are missing");
      return;
    }
    plugin().write = write;
    if (addr.empty()) return;
    const int port = base == 0 ? 0 : base + local_index(c);
    char why[512] = "";
    const int bound = start(&kHost, host.c_str(), port, why, sizeof why);
    if (bound < 0) {
      COMM_WARN(kInit, "rank %d: metrics not served on %s:%d: %s; pick another port with COMM_METRICS_ADDR (the job "
                "runs on without them)", c->rank, host.c_str(), port, why);
      return;
    }
    COMM_INFO(kInit, "rank %d: metrics on http://%s:%d/metrics (%s)", c->rank, host.c_str(), bound, tried.c_str());
    write_targets(c, host, bound);
  });
}

void write_textfile(comm_t c) {
  if (plugin().write == nullptr) return;
  std::string pattern;
  if (!params::get_string("COMM_METRICS_TEXTFILE", &pattern).ok() || pattern.empty()) return;
  const std::string path = expand_file_pattern(pattern, c->rank);
  char why[512] = "";
  if (plugin().write(&kHost, path.c_str(), why, sizeof why) != 0)
    COMM_WARN(kInit, "rank %d: the final metrics could not be written to COMM_METRICS_TEXTFILE %s: %s", c->rank,
              path.c_str(), why);
}

}  // namespace comm::observe

// The registry of live communicators (live.h).
#include "observe/live.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "observe/metrics.h"

namespace comm::observe {
namespace {

// Never destroyed: the plugin's server threads may scrape while the process exits.
std::mutex& registry_mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<comm_t>& registry() {
  static auto* live = new std::vector<comm_t>;
  return *live;
}

}  // namespace

void attach(comm_t c) {
  {
    std::lock_guard<std::mutex> lock(registry_mu());
    registry().push_back(c);
  }
  start_metrics(c);  // once per process, when COMM_METRICS_ADDR asks
}

void detach(comm_t c) {
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(registry_mu());
    auto& live = registry();
    last = live.size() == 1 && live.front() == c;
  }
  // The job's final counts, once, while the last communicator is still in the snapshot.
  if (last) write_textfile(c);
  std::lock_guard<std::mutex> lock(registry_mu());
  auto& live = registry();
  live.erase(std::remove(live.begin(), live.end(), c), live.end());
}

void for_each_live(const std::function<void(comm_t)>& fn) {
  std::lock_guard<std::mutex> lock(registry_mu());
  for (comm_t c : registry()) fn(c);
}

}  // namespace comm::observe

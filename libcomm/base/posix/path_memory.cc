#include "posix/path_memory.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

namespace comm::posix {
namespace {

struct Memory {
  std::mutex mu;
  std::map<std::pair<std::string, std::string>, PathVerdict> paths;
};

Memory& memory() {
  static Memory* m = new Memory;  // never destroyed: read by threads that may outlive statics
  return *m;
}

}  // namespace

bool note_path(const std::string& local_if, const std::string& peer_host, bool works, const std::string&) {
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  PathVerdict& v = m.paths[{local_if, peer_host}];
  const PathVerdict now = works ? PathVerdict::kWorks : PathVerdict::kFails;
  if (v == now) return false;
  v = now;
  return true;
}

PathVerdict path_verdict(const std::string& local_if, const std::string& peer_host) {
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.paths.find({local_if, peer_host});
  return it == m.paths.end() ? PathVerdict::kUnknown : it->second;
}

PathVerdict interface_verdict(const std::string& local_if) {
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  PathVerdict out = PathVerdict::kUnknown;
  for (const auto& [key, v] : m.paths) {
    if (key.first != local_if) continue;
    if (v == PathVerdict::kWorks) return PathVerdict::kWorks;
    out = PathVerdict::kFails;
  }
  return out;
}

std::vector<std::string> interfaces_that_work() {
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  std::vector<std::string> out;
  for (const auto& [key, v] : m.paths)
    if (v == PathVerdict::kWorks && !key.first.empty() &&
        std::find(out.begin(), out.end(), key.first) == out.end())
      out.push_back(key.first);
  return out;
}

}  // namespace comm::posix

// In-process store for ranks that are threads of one process (tests, "memory://NAME").
#include <condition_variable>
#include <map>
#include <mutex>

#include "store/store.h"

namespace comm {
namespace {

class MemoryStore final : public Store {
 public:
  using Store::set;  // the set with a deadline: this store waits on no other process
  Status set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
    return Status::Ok();
  }

  Status get(const std::string& key, std::string* value, Deadline deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline.at(), [&] { return data_.count(key) != 0; }))
      return Timeout("timed out waiting for key '" + key + "' in the in-process store");
    *value = data_[key];
    return Status::Ok();
  }

  Status add(const std::string& key, int64_t delta, int64_t* result) override {
    int64_t now;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = data_.find(key);
      int64_t current = it == data_.end() ? 0 : std::stoll(it->second);
      now = current + delta;
      data_[key] = std::to_string(now);
    }
    cv_.notify_all();
    *result = now;
    return Status::Ok();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

}  // namespace

std::shared_ptr<Store> memory_store(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<Store>> named;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = named[name];
  if (auto existing = slot.lock()) return existing;
  auto created = std::make_shared<MemoryStore>();
  slot = created;
  return created;
}

}  // namespace comm

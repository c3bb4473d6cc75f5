// A store whose blocking get gives up early when waiting has become pointless: the wait runs in
// slices, and between slices a check the owner supplies says whether the key can still come
// (a communicator being set up asks whether a rank it waits for is known dead:
// libcomm/src/setup_watch.h). Everything else passes through.
#include <algorithm>
#include <functional>

#include "store/store.h"

namespace comm {
namespace {

class WatchedStore final : public Store {
 public:
  WatchedStore(std::shared_ptr<Store> base, std::function<Status()> check, int slice_ms)
      : base_(std::move(base)), check_(std::move(check)), slice_(std::chrono::milliseconds(slice_ms)) {}
  Status set(const std::string& key, const std::string& value) override { return base_->set(key, value); }
  Status set(const std::string& key, const std::string& value, Deadline deadline) override {
    return base_->set(key, value, deadline);
  }
  Status get(const std::string& key, std::string* value, Deadline deadline) override {
    for (;;) {
      const Deadline slice(std::min(deadline.at(), Clock::now() + slice_));
      Status st = base_->get(key, value, slice);
      if (st.ok() || st.code() != COMM_ERR_TIMEOUT || deadline.expired()) return st;
      COMM_RETURN_IF_ERROR(check_());
    }
  }
  Status add(const std::string& key, int64_t delta, int64_t* result) override { return base_->add(key, delta, result); }
  void release_idle() override { base_->release_idle(); }
  bool dies_with_rank0() const override { return base_->dies_with_rank0(); }
  std::string reach_address() const override { return base_->reach_address(); }

 private:
  std::shared_ptr<Store> base_;
  std::function<Status()> check_;
  Clock::duration slice_;
};

}  // namespace

std::shared_ptr<Store> make_watched_store(std::shared_ptr<Store> base, std::function<Status()> check, int slice_ms) {
  return std::make_shared<WatchedStore>(std::move(base), std::move(check), slice_ms);
}

}  // namespace comm

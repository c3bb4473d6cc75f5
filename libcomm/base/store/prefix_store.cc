// One store, many communicators: each sees its own key space.
#include "store/store.h"

namespace comm {
namespace {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix) : base_(std::move(base)), prefix_(std::move(prefix) + "/") {}
  Status set(const std::string& key, const std::string& value) override { return base_->set(prefix_ + key, value); }
  Status set(const std::string& key, const std::string& value, Deadline deadline) override {
    return base_->set(prefix_ + key, value, deadline);
  }
  Status get(const std::string& key, std::string* value, Deadline deadline) override {
    return base_->get(prefix_ + key, value, deadline);
  }
  Status add(const std::string& key, int64_t delta, int64_t* result) override {
    return base_->add(prefix_ + key, delta, result);
  }
  void release_idle() override { base_->release_idle(); }
  bool dies_with_rank0() const override { return base_->dies_with_rank0(); }
  std::string reach_address() const override { return base_->reach_address(); }

 private:
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

}  // namespace

std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> base, const std::string& prefix) {
  return std::make_shared<PrefixStore>(std::move(base), prefix);
}

}  // namespace comm

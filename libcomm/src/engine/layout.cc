#include "engine/layout.h"

#include <map>

#include "dtype.h"

namespace comm::engine {

std::vector<BucketLayout> assign_buckets(const std::vector<ParamInfo>& params, const std::vector<int>& order,
                                         size_t cap_bytes, size_t first_bytes) {
  std::vector<BucketLayout> buckets;
  struct Open {
    int bucket = -1;
    size_t bytes = 0;
    bool first = true;
  };
  std::map<int, Open> open;  // per dtype
  for (int p : order) {
    const ParamInfo& info = params[static_cast<size_t>(p)];
    const size_t bytes = info.count * dtype_size(info.dtype);
    Open& o = open[static_cast<int>(info.dtype)];
    const size_t limit = o.first ? first_bytes : cap_bytes;
    if (o.bucket >= 0 && o.bytes + bytes > limit) {
      o.bucket = -1;
      o.first = false;
    }
    if (o.bucket < 0) {
      o.bucket = static_cast<int>(buckets.size());
      o.bytes = 0;
      buckets.emplace_back();
      buckets.back().dtype = info.dtype;
    }
    BucketLayout& b = buckets[static_cast<size_t>(o.bucket)];
    b.params.push_back(p);
    b.offset.push_back(b.count);
    b.count += info.count;
    o.bytes += bytes;
    // A bucket that reached its limit exactly is closed now, so the next parameter opens one.
    if (o.bytes >= (o.first ? first_bytes : cap_bytes)) {
      o.bucket = -1;
      o.first = false;
    }
  }
  return buckets;
}

std::vector<int> reverse_order(size_t num_params) {
  std::vector<int> order(num_params);
  for (size_t i = 0; i < num_params; ++i) order[i] = static_cast<int>(num_params - 1 - i);
  return order;
}

}  // namespace comm::engine

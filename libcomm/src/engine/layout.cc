#include "engine/layout.h"

#include <algorithm>
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

std::vector<PartitionLayout> cut_partitions(const std::vector<BucketLayout>& buckets,
                                            const std::vector<ParamInfo>& params,
                                            const std::vector<int>& priority, size_t partition_bytes) {
  std::vector<PartitionLayout> parts;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const BucketLayout& bk = buckets[b];
    const size_t limit = std::max<size_t>(1, partition_bytes / dtype_size(bk.dtype));  // elements
    const size_t first = parts.size();
    PartitionLayout open;
    open.bucket = static_cast<int>(b);
    auto close = [&](size_t next_begin) {
      if (!open.params.empty()) parts.push_back(open);
      open.params.clear();
      open.begin = next_begin;
      open.count = 0;
    };
    for (size_t i = 0; i < bk.params.size(); ++i) {
      const int p = bk.params[i];
      const size_t off = bk.offset[i], n = params[static_cast<size_t>(p)].count;
      if (open.count > 0 && open.count + n > limit) close(off);
      if (n <= limit) {
        if (open.params.empty()) open.begin = off;
        open.params.push_back(p);
        open.count += n;
        continue;
      }
      // Larger than a partition: equal pieces, each a partition of its own.
      close(off);
      const size_t pieces = (n + limit - 1) / limit, piece = (n + pieces - 1) / pieces;
      for (size_t at = 0; at < n; at += piece) {
        open.begin = off + at;
        open.count = std::min(piece, n - at);
        open.params.push_back(p);
        close(off + at + open.count);
      }
    }
    close(bk.count);
    if (parts.size() == first) {  // a bucket of zero-sized parameters only
      open.params = bk.params;
      parts.push_back(open);
    }
  }
  for (PartitionLayout& pt : parts) {
    pt.priority = priority[static_cast<size_t>(pt.params.front())];
    for (int p : pt.params) pt.priority = std::min(pt.priority, priority[static_cast<size_t>(p)]);
  }
  return parts;
}

std::vector<int> reverse_order(size_t num_params) {
  std::vector<int> order(num_params);
  for (size_t i = 0; i < num_params; ++i) order[i] = static_cast<int>(num_params - 1 - i);
  return order;
}

}  // namespace comm::engine

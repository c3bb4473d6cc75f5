// What the last synced step did, for comm_engine_stats and comm_engine_unused.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "dtype.h"
#include "engine/engine.h"
#include "engine/messages.h"
#include "engine_view.h"
#include "log.h"

namespace comm::engine {

void Engine::stats(comm_engine_stats_t* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (step_unrecorded_ && !comm_active_ && broken_.ok()) record_overlapped_step();
  comm_engine_stats_t s{};
  s.size = out->size;
  s.version = COMM_ENGINE_STATS_VERSION;
  s.steps = steps_;
  s.synced_steps = synced_steps_;
  s.last_synced = last_synced_ ? 1 : 0;
  s.num_buckets = static_cast<int>(buckets_.size());
  s.layout_version = layout_version_;
  s.num_partitions = static_cast<int>(parts_.size());
  if (synced_steps_ > 0) {
    s.bytes = last_bytes_;
    s.step_us = last_step_us_;
    s.exposed_comm_us = last_exposed_us_;
    const size_t nb = std::min(last_buckets_.size(), static_cast<size_t>(COMM_ENGINE_STATS_MAX_BUCKETS));
    for (const auto& p : last_parts_) {
      s.comm_us += p.done_us - p.start_us;
      s.wait_us += p.start_us - p.ready_us;
    }
    s.rounds = last_rounds_;
    s.round_us = last_round_us_;
    s.forward_wait_us = last_forward_wait_us_;
    const size_t np = std::min(last_parts_.size(), static_cast<size_t>(COMM_ENGINE_STATS_MAX_PARTITIONS));
    s.num_partition_stats = static_cast<int>(np);
    std::copy(last_parts_.begin(), last_parts_.begin() + static_cast<std::ptrdiff_t>(np), s.partitions);
    s.num_bucket_stats = static_cast<int>(nb);
    std::copy(last_buckets_.begin(), last_buckets_.begin() + static_cast<std::ptrdiff_t>(nb), s.buckets);
    s.num_unused = static_cast<int>(last_unused_.size());
    for (size_t i = 0; i < last_unused_.size() && i < COMM_ENGINE_STATS_MAX_UNUSED; ++i) s.unused[i] = last_unused_[i];
  }
  s.overlap_ratio = s.comm_us > 0 ? std::clamp(1.0 - s.exposed_comm_us / s.comm_us, 0.0, 1.0) : 1.0;
  std::memcpy(out, &s, std::min(out->size, sizeof s));
}

Status Engine::unused(int* indices, int capacity, int* count) {
  std::lock_guard<std::mutex> lock(mu_);
  *count = static_cast<int>(last_unused_.size());
  for (int i = 0; i < capacity && i < *count; ++i) indices[i] = last_unused_[static_cast<size_t>(i)];
  return Status::Ok();
}

}  // namespace comm::engine

#include "group.h"

#include <utility>
#include <vector>

#include "communicator.h"
#include "device/device.h"

namespace comm {
namespace {

// The depth apart from the calls: in_group() runs on every collective, and a thread_local of
// a type with a constructor costs an initialisation check and a TLS lookup on each access.
thread_local int t_group_depth = 0;
thread_local std::vector<std::pair<comm_t, algo::CollArgs>> t_group_calls;

}  // namespace

void group_start() { ++t_group_depth; }

bool in_group() { return t_group_depth > 0; }

void group_add(comm_t comm, const algo::CollArgs& args) { t_group_calls.emplace_back(comm, args); }

Status group_end() {
  if (t_group_depth == 0)
    return InvalidUsage("comm_group_end without a matching comm_group_start");
  if (--t_group_depth > 0) return Status::Ok();
  auto calls = std::move(t_group_calls);
  t_group_calls.clear();
  // Device calls went into an NCCL group as they came; it ends first (they are on streams).
  Status first = device::group_end();

  // Per communicator, in order of first appearance: all sends and receives posted together,
  // then the collectives in issue order. (Sends/receives spanning several communicators in
  // one group are progressed one communicator at a time.)
  std::vector<comm_t> comms;
  for (auto& [c, args] : calls) {
    bool seen = false;
    for (comm_t k : comms) seen = seen || k == c;
    if (!seen) comms.push_back(c);
  }
  for (comm_t c : comms) {
    {
      std::unique_lock<std::mutex> lock(c->queue_mu);
      if (c->worker_lazy) c->queue_cv.notify_all();  // queued calls start now, not at its next look
      c->queue_cv.wait(lock, [&] { return c->queue.empty() && !c->worker_busy; });
    }
    std::vector<algo::CollArgs> p2p;
    for (auto& [k, args] : calls)
      if (k == c && args.kind == transport::CollKind::kSendRecv) p2p.push_back(args);
    Status st = execute_p2p_batch(c, std::move(p2p));
    if (!st.ok() && first.ok()) first = st;
    for (auto& [k, args] : calls) {
      if (k != c || args.kind == transport::CollKind::kSendRecv) continue;
      st = execute(c, args);
      if (!st.ok() && first.ok()) first = st;
    }
  }
  Status copied = device::group_finish(first.ok());  // staged device receives back to the device
  if (first.ok()) first = copied;
  return first;
}

}  // namespace comm

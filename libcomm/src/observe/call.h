// Around each call execute() runs: straggler detection's start mark, and afterwards the
// communicator's counters and the flight recorder's entry get what the call showed (stats.h).
#pragma once

#include "common/arrivals.h"
#include "communicator.h"

namespace comm::observe {

// After recorder.begin(): the transports count each peer's first message from this call's start.
inline void begin_call(comm_t c, size_t slot, const transport::OpTag& tag) {
  if (c->arrivals) c->arrivals->begin(tag.seq, c->recorder.start_ns(slot));
}

// After recorder.end(): bytes as nccl-tests' size column counts them (tuning::call_bytes).
inline void end_call(comm_t c, size_t slot, transport::CollKind kind, uint64_t bytes, const char* algorithm,
                     const Status& st) {
  int peer = -1;
  uint64_t wait_ns = 0;
  if (c->arrivals) {
    c->arrivals->end();
    peer = c->arrivals->last_peer();
    wait_ns = c->arrivals->last_wait_ns();
    c->recorder.set_last_arrival(slot, peer, wait_ns);
  }
  const uint64_t start = c->recorder.start_ns(slot), end = c->recorder.end_ns(slot);
  c->stats.record(kind, bytes, end > start ? end - start : 0, algorithm, peer, wait_ns);
  if (!st.ok()) c->stats.error(st.code());
}

}  // namespace comm::observe

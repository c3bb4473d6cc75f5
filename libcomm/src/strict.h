// Strict mode (COMM_CHECK_COLLECTIVES=1, docs/design/core.md, "Strict mode"): every collective
// confirms with every rank that all called the same thing before it returns.
#pragma once

#include "algorithms/algorithm.h"
#include "communicator.h"

namespace comm {

// After `args` ran without error on this rank: gathers every rank's signature (sequence number,
// collective, dtype, count, op, root) and fails with INVALID_USAGE, naming two ranks and what
// each called, when they differ. Every rank sees the same signatures, so every rank fails alike.
Status confirm_signature(comm_t c, algo::Context& ctx, const algo::CollArgs& args);

}  // namespace comm

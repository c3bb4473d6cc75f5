// Following a hang to the rank that causes it (docs/design/core.md, "Which rank hangs").
#pragma once

#include "communicator.h"

namespace comm {

// A wait that timed out, or a peer's report that its own wait did, names only the peer this
// rank waited on, which may itself be waiting on the rank that stalls. Each rank that fails
// this way publishes in the job store what it waited on (peers and calls), then follows the
// others' entries from its own peers to the ranks that published nothing within a grace
// (COMM_TIMEOUT_MS / 4, within 0.25-2 s): stopped, hung outside libcomm, or not calling the operation.
// Returns the failure with the verdict in front ("rank 3 is stalled: rank 1 waited on rank 0,
// rank 0 waited on rank 3; ..."), or unchanged when the transport saw no hang.
// Call on the thread that drove the failed wait, before the communicator is marked broken
// with the result; it blocks up to the grace (less after comm_abort).
Status trace_hang(comm_t c, const Status& failure);

}  // namespace comm

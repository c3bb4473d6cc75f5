// NCCL's group semantics (per thread, nestable): calls between comm_group_start and the
// outermost comm_group_end are validated and stamped at once, and issued together at the
// end, so sends and receives among them cannot deadlock each other.
#pragma once

#include "algorithms/algorithm.h"
#include "comm/comm.h"
#include "status.h"

namespace comm {

void group_start();
Status group_end();
bool in_group();
// Records an already validated and stamped call for the group's end.
void group_add(comm_t comm, const algo::CollArgs& args);

}  // namespace comm

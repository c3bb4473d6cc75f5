// The metrics plugin's life on libcomm's side (docs/observability.md): opened at the first
// communicator when COMM_METRICS_ADDR is set, listening on port + this rank's local index, its
// address written to COMM_METRICS_FILE for Prometheus's file-based discovery; the final counts
// written to COMM_METRICS_TEXTFILE when the last communicator goes. Nothing here fails init: a
// plugin that is missing or a port that is taken is a warning.
#pragma once

#include <cstddef>

#include "communicator.h"

namespace comm::observe {

void start_metrics(comm_t c);
void write_textfile(comm_t last);
// The snapshot the plugin reads (metrics_plugin.h); observe/snapshot.cc.
size_t snapshot(char* out, size_t cap);

}  // namespace comm::observe

/* The interface between libcomm and its metrics plugin (libcomm_metrics.so, plugins/metrics/),
 * which libcomm opens with dlopen only when COMM_METRICS_ADDR is set (docs/observability.md), so
 * that libcomm.so.1 links nothing of Prometheus and loads anywhere. C types only: the plugin may be
 * built apart from the library. The plugin reads everything through snapshot(): JSON of every
 * live communicator's counters, produced by libcomm at each scrape (observe/snapshot.cc). */
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COMM_METRICS_PLUGIN_VERSION 1

struct comm_metrics_host {
  int version; /* COMM_METRICS_PLUGIN_VERSION */
  /* Writes the snapshot (NUL-terminated) into out when it fits in cap bytes; returns its length
   * without the NUL (call again with a larger buffer when that is >= cap). Any thread. */
  size_t (*snapshot)(char* out, size_t cap);
};

/* Serves the metrics on http://host:port/metrics (port 0: one the kernel picks). Returns the
 * port it listens on, or -1 with why (NUL-terminated, at most why_cap bytes) when it cannot. */
typedef int (*comm_metrics_start_fn)(const struct comm_metrics_host* host, const char* address, int port, char* why,
                                     size_t why_cap);
/* Writes the metrics once, in the text format node exporter's textfile collector reads, to path
 * (through a temporary file and a rename). 0, or -1 with why. */
typedef int (*comm_metrics_write_fn)(const struct comm_metrics_host* host, const char* path, char* why,
                                     size_t why_cap);

#define COMM_METRICS_START_SYMBOL "comm_metrics_plugin_start_v1"
#define COMM_METRICS_WRITE_SYMBOL "comm_metrics_plugin_write_v1"

#ifdef __cplusplus
}
#endif

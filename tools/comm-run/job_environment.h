// What every rank is started with: torchrun's environment variables (one port and run id for
// the job) and the CPUs comm-run may pin ranks to.
#pragma once

#include <string>
#include <vector>

#include "options.h"

namespace comm_run {

// MASTER_PORT when the caller set it, else a port nobody listens on right now; false (with
// errno) when none can be found.
bool job_port(std::string* port);

// "comm-run-<pid>-<seconds>": unique per run (TORCHELASTIC_RUN_ID).
std::string job_run_id();

// The CPUs this process may run on, ascending (empty when unknown).
std::vector<int> allowed_cpus();

// The environment of rank `rank`: ours, minus what we set, plus torchrun's variables.
// With --replace-failed, COMM_STORE_EXTERNAL=1 (comm-run serves the store); join: COMM_JOIN=1 (a
// replacement, which joins the survivors at their next comm_grow).
std::vector<std::string> rank_environment(const Options& opt, int rank, const std::string& port,
                                          const std::string& run_id, bool join = false);

}  // namespace comm_run

// The shared engine: warm-up, timing, checking and printing in nccl-tests' format, for any
// Backend. Only rank 0 prints the table; every line that is not a table row starts with '#'.
#pragma once

#include "backend.h"

namespace bench {

// Parses the command line, runs the benchmark on `backend`, returns main's exit status
// (1 when a call failed or a check counted wrong elements).
int run_bench(int argc, char** argv, const char* prog, Backend& backend);

}  // namespace bench

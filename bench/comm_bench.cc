// comm-bench: nccl-tests' table for libcomm's collectives, through the public C ABI only.
// One program for all seven collectives: --op-name, or run it under nccl-tests' names
// (all_reduce_perf, all_gather_perf, ... are links to it).
#include "engine.h"
#include "libcomm_backend.h"

int main(int argc, char** argv) {
  auto backend = bench::make_libcomm_backend();
  return bench::run_bench(argc, argv, "comm-bench", *backend);
}

// comm-bench's command line: nccl-tests' flags plus libcomm's, in one struct.
#pragma once

#include <comm/comm.h>

#include <cstddef>
#include <string>
#include <vector>

namespace bench {

struct Collective;

// How the per-rank times of one size become the reported time (nccl-tests' -a).
enum class Average { kRank0 = 0, kMean = 1, kMin = 2, kMax = 3 };

struct Options {
  const Collective* coll = nullptr;  // --op-name, or the program's name (all_reduce_perf, ...)
  size_t min_bytes = 32 << 20;       // nccl-tests' defaults
  size_t max_bytes = 32 << 20;
  size_t step_bytes = 1 << 20;
  size_t step_factor = 1;
  int iters = 20;
  int warmup_iters = 5;
  int check = 1;  // checked runs per size (0: none)
  std::vector<comm_dtype_t> dtypes = {COMM_FLOAT32};
  std::vector<comm_op_t> ops = {COMM_SUM};
  int root = 0;
  bool blocking = false;  // -z 1: each call returns before the next is issued
  Average average = Average::kMax;
  bool registered = false;  // -R 1 (or 2): buffers from the library's own allocator (comm_mem_alloc)
  bool device = false;      // --device 1: CUDA managed buffers, calls on a stream (device buffers)
  int graph_launches = 0;   // -G: nccl-tests' CUDA graph launches; only 0 runs (libcomm cannot be captured)
  int agg_iters = 1;        // -m: calls issued together per timed iteration
  int run_cycles = 1;       // -N: the whole sweep this many times (0: until interrupted)
  bool cputime = false;     // -C 1: report the time to issue the calls, not to complete them
  bool parallel_init = false;  // -p 1: accepted; one rank per process has nothing to init in parallel
  bool stream_null = false;    // -y 1: device calls on the default (NULL) stream
  int timeout_s = 0;           // -T: a call that makes no progress this long fails (0: libcomm's default)
  bool timestamps = false;     // -S 1: each row ends with the date and time it finished
  bool memory_report = false;  // -M 1: the buffers' bytes and peak resident memory, after the table
  bool show_version = false;   // --version
  std::string transport;    // "" : the library's default
  std::string algo;         // "" : the library's choice
  std::string json_path;
  std::string csv_path;
  std::string label;        // names this run in JSON/CSV and plots (default: library/transport/algo)
  int hold_s = 0;           // --hold_s: keep the communicator, idle, this long after the sweep (a scraper reads the totals)
  std::vector<std::string> argv;  // as given, for the JSON record
};

// Parses argv. Returns -1 to go on, otherwise the exit status for main (help printed, or an
// error said on stderr). `library` names the program in messages ("comm-bench", ...).
int parse_options(int argc, char** argv, const char* library, Options* opt);

// Opens PATH for writing without truncating it (the results are written at the end): "" when it
// can be written, else "cannot write --json PATH: <strerror> (errno N)".
std::string check_writable(const std::string& flag, const std::string& path);

// "8", "1K", "64M", "1G" (binary units, as nccl-tests); a trailing 'B' is allowed.
bool parse_size(const char* text, size_t* out);

}  // namespace bench

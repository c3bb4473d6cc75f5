// nccl-tests' flags with nccl-tests' meanings, so that a command line written for
// all_reduce_perf runs here unchanged; the library's own flags are long options only.
#include "options.h"

#include <fcntl.h>
#include <getopt.h>
#include <unistd.h>

#include <cerrno>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "collectives.h"
#include "values.h"

namespace bench {
namespace {

void usage(FILE* out, const char* prog) {
  std::fprintf(out,
      "USAGE: %s [options]\n"
      "\t[-b,--minbytes <min size in bytes>] (8, 1K, 64M, 1G; default 32M)\n"
      "\t[-e,--maxbytes <max size in bytes>] (default 32M)\n"
      "\t[-i,--stepbytes <increment size>] (used when the step factor is 1; default 1M)\n"
      "\t[-f,--stepfactor <increment factor>] (default 1)\n"
      "\t[-n,--iters <iteration count>] (default 20)\n"
      "\t[-m,--agg_iters <aggregated iteration count>] (calls issued together per iteration; default 1)\n"
      "\t[-w,--warmup_iters <warmup iteration count>] (default 5)\n"
      "\t[-N,--run_cycles <cycle count>] (run and print the sweep this many times; 0: until interrupted; default 1)\n"
      "\t[-p,--parallel_init <0/1>] (accepted; one rank per process)\n"
      "\t[-c,--check <check iteration count>] (0: no check; default 1)\n"
      "\t[-o,--op <sum/prod/min/max/avg/all>] (default sum)\n"
      "\t[-d,--datatype <float/double/half/bfloat16/int8/uint8/int32/uint32/int64/uint64/all>] (default float)\n"
      "\t[-r,--root <root>] (broadcast, reduce; default 0)\n"
      "\t[-z,--blocking <0/1>] (0: issue all iterations, then wait (non-blocking calls); 1: one call at a time; "
      "default 0)\n"
      "\t[-y,--stream_null <0/1>] (--device 1: 1 puts the calls on the default stream; default 0)\n"
      "\t[-T,--timeout <time in seconds>] (a call that makes no progress this long fails; 0: libcomm's "
      "COMM_TIMEOUT_MS)\n"
      "\t[-G,--cudagraph <num graph launches>] (0 only: libcomm's calls cannot be captured in a CUDA graph)\n"
      "\t[-C,--report_cputime <0/1>] (1: the time to issue the calls, not to complete them)\n"
      "\t[-S,--report_timestamps <0/1>] (1: each row ends with the time it finished)\n"
      "\t[-J,--output_file <file>] (JSON results, as --json)\n"
      "\t[-a,--average <0/1/2/3>] (time reported: 0 rank 0's, 1 mean, 2 min, 3 max over ranks; default 3)\n"
      "\t[-R,--local_register <0/1/2>] (1, 2: buffers from the library's allocator, comm_mem_alloc; default 0)\n"
      "\t[-M,--memory_report <0/1>] (1: buffer bytes and peak resident memory after the table)\n"
      "\t[-t,--nthreads 1] [-g,--ngpus 1] (one rank per process: more ranks come from the launcher)\n"
      "\t[--device <0/1>] (libcomm: 1: CUDA managed buffers and a CUDA stream, so calls take the device path:\n"
      "\t  NCCL, or staged through pinned host memory; -z 0 enqueues every iteration, then synchronises; default 0)\n"
      "\t[--op-name <allreduce/allgather/reduce_scatter/broadcast/reduce/alltoall/sendrecv>] (default: from the\n"
      "\t  program's name, all_reduce_perf and so on, else allreduce)\n"
      "\t[--transport <name>] (libcomm: auto, socket, ...; sets comm_config_t.transport)\n"
      "\t[--algo <name>] (libcomm: COMM_ALGO for this run, e.g. ring, recursive_doubling)\n"
      "\t[--json FILE] [--csv FILE] (results, written by rank 0) [--label TEXT] (the run's name in them)\n"
      "\t[--hold_s S] (after the sweep, keep the communicator idle S seconds: a metrics scraper reads the totals)\n"
      "\t[--version] [-h,--help]\n"
      "Rank and size come from the launcher (env://): run it under comm-run, torchrun, mpirun or srun.\n",
      prog);
}

// The option getopt refused: "-x" for a short one (optopt), else the argument itself (a long one).
std::string bad_option(char** argv) {
  if (optopt != 0) return std::string("-") + static_cast<char>(optopt);
  return argv[optind - 1];
}

bool parse_int(const char* text, long min, long max, long* out) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 0);
  if (end == text || *end != '\0' || v < min || v > max) return false;
  *out = v;
  return true;
}

enum LongOnly { kOpName = 1000, kTransport, kAlgo, kJson, kCsv, kLabel, kDevice, kVersion, kHold };

const char* long_name(int c) {
  switch (c) {
    case kOpName: return "op-name";
    case kDevice: return "device";
    default: return "option";
  }
}

}  // namespace

bool parse_size(const char* text, size_t* out) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || !(v >= 0)) return false;
  double unit = 1;
  switch (*end) {
    case 'k': case 'K': unit = 1024.0; ++end; break;
    case 'm': case 'M': unit = 1024.0 * 1024; ++end; break;
    case 'g': case 'G': unit = 1024.0 * 1024 * 1024; ++end; break;
    case 't': case 'T': unit = 1024.0 * 1024 * 1024 * 1024; ++end; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0' || v * unit > 1e15) return false;
  *out = static_cast<size_t>(v * unit);
  return true;
}

int parse_options(int argc, char** argv, const char* library, Options* opt) {
  opt->argv.assign(argv, argv + argc);
  const char* base = std::strrchr(argv[0], '/');
  base = base != nullptr ? base + 1 : argv[0];
  opt->coll = find_collective(base);
  if (opt->coll == nullptr) opt->coll = find_collective("allreduce");

  const option longopts[] = {
      {"minbytes", required_argument, nullptr, 'b'},   {"maxbytes", required_argument, nullptr, 'e'},
      {"stepbytes", required_argument, nullptr, 'i'},  {"stepfactor", required_argument, nullptr, 'f'},
      {"iters", required_argument, nullptr, 'n'},      {"agg_iters", required_argument, nullptr, 'm'},
      {"warmup_iters", required_argument, nullptr, 'w'}, {"run_cycles", required_argument, nullptr, 'N'},
      {"parallel_init", required_argument, nullptr, 'p'}, {"check", required_argument, nullptr, 'c'},
      {"op", required_argument, nullptr, 'o'},         {"datatype", required_argument, nullptr, 'd'},
      {"root", required_argument, nullptr, 'r'},       {"blocking", required_argument, nullptr, 'z'},
      {"stream_null", required_argument, nullptr, 'y'}, {"timeout", required_argument, nullptr, 'T'},
      {"cudagraph", required_argument, nullptr, 'G'},  {"report_cputime", required_argument, nullptr, 'C'},
      {"report_timestamps", required_argument, nullptr, 'S'}, {"output_file", required_argument, nullptr, 'J'},
      {"average", required_argument, nullptr, 'a'},    {"local_register", required_argument, nullptr, 'R'},
      {"memory_report", required_argument, nullptr, 'M'},
      {"nthreads", required_argument, nullptr, 't'},   {"ngpus", required_argument, nullptr, 'g'},
      {"device", required_argument, nullptr, kDevice}, {"op-name", required_argument, nullptr, kOpName},
      {"transport", required_argument, nullptr, kTransport}, {"algo", required_argument, nullptr, kAlgo},
      {"json", required_argument, nullptr, kJson},     {"csv", required_argument, nullptr, kCsv},
      {"label", required_argument, nullptr, kLabel},   {"version", no_argument, nullptr, kVersion},
      {"hold_s", required_argument, nullptr, kHold},
      {"help", no_argument, nullptr, 'h'},             {nullptr, 0, nullptr, 0},
  };
  opterr = 0;  // one line of our own below, not getopt's and the whole usage
  for (;;) {
    int c = getopt_long(argc, argv, ":b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:S:J:a:R:M:t:g:h", longopts, nullptr);
    if (c == -1) break;
    long v = 0;
    bool ok = true;
    switch (c) {
      case 'b': ok = parse_size(optarg, &opt->min_bytes); break;
      case 'e': ok = parse_size(optarg, &opt->max_bytes); break;
      case 'i': ok = parse_size(optarg, &opt->step_bytes); break;
      case 'f':
        ok = parse_int(optarg, 1, 1 << 20, &v);
        opt->step_factor = static_cast<size_t>(v);
        break;
      case 'n':
        ok = parse_int(optarg, 1, 1 << 30, &v);
        opt->iters = static_cast<int>(v);
        break;
      case 'm':
        ok = parse_int(optarg, 1, 1 << 20, &v);
        opt->agg_iters = static_cast<int>(v);
        break;
      case 'w':
        ok = parse_int(optarg, 0, 1 << 30, &v);
        opt->warmup_iters = static_cast<int>(v);
        break;
      case 'N':
        ok = parse_int(optarg, 0, 1 << 30, &v);
        opt->run_cycles = static_cast<int>(v);
        break;
      case 'p':
        ok = parse_int(optarg, 0, 1, &v);
        opt->parallel_init = v == 1;
        break;
      case 'c':
        ok = parse_int(optarg, 0, 1000, &v);
        opt->check = static_cast<int>(v);
        break;
      case 'r':
        ok = parse_int(optarg, 0, 1 << 24, &v);
        opt->root = static_cast<int>(v);
        break;
      case 'z':
        ok = parse_int(optarg, 0, 1, &v);
        opt->blocking = v == 1;
        break;
      case 'y':
        ok = parse_int(optarg, 0, 1, &v);
        opt->stream_null = v == 1;
        break;
      case 'T':
        ok = parse_int(optarg, 0, 1 << 20, &v);
        opt->timeout_s = static_cast<int>(v);
        break;
      case 'G':
        ok = parse_int(optarg, 0, 1 << 30, &v);
        opt->graph_launches = static_cast<int>(v);
        break;
      case 'C':
        ok = parse_int(optarg, 0, 1, &v);
        opt->cputime = v == 1;
        break;
      case 'S':
        ok = parse_int(optarg, 0, 1, &v);
        opt->timestamps = v == 1;
        break;
      case 'J': opt->json_path = optarg; break;
      case 'a':
        ok = parse_int(optarg, 0, 3, &v);
        opt->average = static_cast<Average>(v);
        break;
      case 'R':  // nccl-tests: 1 local, 2 symmetric registration; comm_mem_alloc is both here
        ok = parse_int(optarg, 0, 2, &v);
        opt->registered = v >= 1;
        break;
      case 'M':
        ok = parse_int(optarg, 0, 1, &v);
        opt->memory_report = v == 1;
        break;
      case kDevice:
        ok = parse_int(optarg, 0, 1, &v);
        opt->device = v == 1;
        break;
      case 't':
      case 'g':
        ok = parse_int(optarg, 1, 1 << 20, &v);
        if (ok && v > 1) {
          std::fprintf(stderr,
                       "# %s: -%c %ld: one GPU per process: launch %ld ranks with comm-run -n %ld / torchrun "
                       "--nproc_per_node %ld\n",
                       library, c, v, v, v, v);
          return 2;
        }
        break;
      case 'o':
        opt->ops.clear();
        if (std::strcmp(optarg, "all") == 0) {
          for (int i = 0; i < COMM_NUM_OPS; ++i) opt->ops.push_back(static_cast<comm_op_t>(i));
        } else {
          comm_op_t op = COMM_SUM;
          ok = find_op(optarg, &op);
          opt->ops.push_back(op);
        }
        break;
      case 'd':
        opt->dtypes.clear();
        if (std::strcmp(optarg, "all") == 0) {
          for (const auto& d : all_dtypes()) opt->dtypes.push_back(d.dtype);
        } else if (const DtypeInfo* d = find_dtype(optarg)) {
          opt->dtypes.push_back(d->dtype);
        } else {
          ok = false;
        }
        break;
      case kOpName:
        opt->coll = find_collective(optarg);
        ok = opt->coll != nullptr;
        break;
      case kTransport: opt->transport = optarg; break;
      case kAlgo: opt->algo = optarg; break;
      case kJson: opt->json_path = optarg; break;
      case kCsv: opt->csv_path = optarg; break;
      case kLabel: opt->label = optarg; break;
      case kHold:
        ok = parse_int(optarg, 0, 24 * 3600, &v);
        opt->hold_s = static_cast<int>(v);
        break;
      case kVersion: opt->show_version = true; return 0;
      case 'h': usage(stdout, library); return 0;
      case ':':
        std::fprintf(stderr, "# %s: %s needs a value; see --help\n", library, argv[optind - 1]);
        return 2;
      default:
        std::fprintf(stderr, "# %s: unknown option '%s'; see --help\n", library, bad_option(argv).c_str());
        return 2;
    }
    if (!ok) {
      if (c >= kOpName)
        std::fprintf(stderr, "# %s: invalid value '%s' for --%s; see --help\n", library, optarg, long_name(c));
      else
        std::fprintf(stderr, "# %s: invalid value '%s' for -%c; see --help\n", library, optarg, c);
      return 2;
    }
  }
  if (optind < argc) {
    std::fprintf(stderr, "# %s: unexpected argument '%s'\n", library, argv[optind]);
    return 2;
  }
  if (opt->min_bytes > opt->max_bytes) {
    std::fprintf(stderr, "# %s: invalid sizes for 'minbytes' and 'maxbytes': %zu > %zu\n", library, opt->min_bytes,
                 opt->max_bytes);
    return 2;
  }
  if (opt->step_factor == 1 && opt->step_bytes == 0) {
    std::fprintf(stderr, "# %s: -f 1 needs -i > 0\n", library);
    return 2;
  }
  if (opt->graph_launches > 0) {
    std::fprintf(stderr,
                 "# %s: -G %d: CUDA graphs are not supported: %s; run with -G 0 (the default)\n", library,
                 opt->graph_launches,
                 opt->device ? "libcomm's device calls check their order on the host at every call, so they "
                               "cannot be captured and replayed"
                             : "host buffers are not on a stream (and libcomm's device calls, --device 1, cannot "
                               "be captured either)");
    return 2;
  }
  return -1;
}

std::string check_writable(const std::string& flag, const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return "cannot write " + flag + " " + path + ": " + std::strerror(err) + " (errno " + std::to_string(err) +
           "); results would be lost, so nothing was run";
  }
  ::close(fd);
  return "";
}

}  // namespace bench

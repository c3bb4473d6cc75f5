// nccl-tests' flags with nccl-tests' meanings, so that a command line written for
// all_reduce_perf runs here unchanged; the library's own flags are long options only.
#include "options.h"

#include <getopt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

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
      "\t[-w,--warmup_iters <warmup iteration count>] (default 5)\n"
      "\t[-c,--check <check iteration count>] (0: no check; default 1)\n"
      "\t[-o,--op <sum/prod/min/max/avg/all>] (default sum)\n"
      "\t[-d,--datatype <float/double/half/bfloat16/int8/uint8/int32/uint32/int64/uint64/all>] (default float)\n"
      "\t[-r,--root <root>] (broadcast, reduce; default 0)\n"
      "\t[-z,--blocking <0/1>] (0: issue all iterations, then wait (non-blocking calls); 1: one call at a time; "
      "default 0)\n"
      "\t[-a,--average <0/1/2/3>] (time reported: 0 rank 0's, 1 mean, 2 min, 3 max over ranks; default 3)\n"
      "\t[-R,--local_register <0/1>] (1: buffers from the library's allocator, comm_mem_alloc; default 0)\n"
      "\t[-G,--device <0/1>] (libcomm: 1: CUDA managed buffers and a CUDA stream, so calls take the device path:\n"
      "\t  NCCL, or staged through pinned host memory; -z 0 enqueues every iteration, then synchronises; default 0)\n"
      "\t[-t,--nthreads 1] [-g,--ngpus 1] (accepted for nccl-tests command lines; one rank per process)\n"
      "\t[--op-name <allreduce/allgather/reduce_scatter/broadcast/reduce/alltoall/sendrecv>] (default: from the\n"
      "\t  program's name, all_reduce_perf and so on, else allreduce)\n"
      "\t[--transport <name>] (libcomm: auto, socket, ...; sets comm_config_t.transport)\n"
      "\t[--algo <name>] (libcomm: COMM_ALGO for this run, e.g. ring, recursive_doubling)\n"
      "\t[--json FILE] [--csv FILE] (results, written by rank 0) [--label TEXT] (the run's name in them)\n"
      "\t[-h,--help]\n"
      "Rank and size come from the launcher (env://): run it under comm-run, torchrun, mpirun or srun.\n",
      prog);
}

bool parse_int(const char* text, long min, long max, long* out) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 0);
  if (end == text || *end != '\0' || v < min || v > max) return false;
  *out = v;
  return true;
}

enum LongOnly { kOpName = 1000, kTransport, kAlgo, kJson, kCsv, kLabel };

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
      {"iters", required_argument, nullptr, 'n'},      {"warmup_iters", required_argument, nullptr, 'w'},
      {"check", required_argument, nullptr, 'c'},      {"op", required_argument, nullptr, 'o'},
      {"datatype", required_argument, nullptr, 'd'},   {"root", required_argument, nullptr, 'r'},
      {"blocking", required_argument, nullptr, 'z'},   {"average", required_argument, nullptr, 'a'},
      {"local_register", required_argument, nullptr, 'R'},
      {"device", required_argument, nullptr, 'G'},
      {"nthreads", required_argument, nullptr, 't'},   {"ngpus", required_argument, nullptr, 'g'},
      {"op-name", required_argument, nullptr, kOpName}, {"transport", required_argument, nullptr, kTransport},
      {"algo", required_argument, nullptr, kAlgo},     {"json", required_argument, nullptr, kJson},
      {"csv", required_argument, nullptr, kCsv},       {"label", required_argument, nullptr, kLabel},
      {"help", no_argument, nullptr, 'h'},             {nullptr, 0, nullptr, 0},
  };
  for (;;) {
    int c = getopt_long(argc, argv, "b:e:i:f:n:w:c:o:d:r:z:a:R:G:t:g:h", longopts, nullptr);
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
      case 'w':
        ok = parse_int(optarg, 0, 1 << 30, &v);
        opt->warmup_iters = static_cast<int>(v);
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
      case 'a':
        ok = parse_int(optarg, 0, 3, &v);
        opt->average = static_cast<Average>(v);
        break;
      case 'R':
        ok = parse_int(optarg, 0, 1, &v);
        opt->registered = v == 1;
        break;
      case 'G':
        ok = parse_int(optarg, 0, 1, &v);
        opt->device = v == 1;
        break;
      case 't':
      case 'g': ok = parse_int(optarg, 1, 1, &v); break;
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
      case 'h': usage(stdout, library); return 0;
      default: usage(stderr, library); return 2;
    }
    if (!ok) {
      if (c >= kOpName)
        std::fprintf(stderr, "# %s: invalid value '%s' for --%s\n", library, optarg,
                     c == kOpName ? "op-name" : "option");
      else
        std::fprintf(stderr, "# %s: invalid value '%s' for -%c\n", library, optarg, c);
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
  return -1;
}

}  // namespace bench

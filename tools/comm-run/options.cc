#include "options.h"

#include <getopt.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "version.h"

namespace comm_run {

void usage(FILE* out) {
  std::fprintf(out,
      "usage: comm-run -n N [options] [--] PROGRAM [ARGS...]\n"
      "       comm-run --params\n"
      "\n"
      "Starts N local ranks of PROGRAM with torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK,\n"
      "LOCAL_WORLD_SIZE=N, GROUP_RANK=0, ROLE_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT (a free port,\n"
      "unless MASTER_PORT is already set) and TORCHELASTIC_RUN_ID (unique per run).\n"
      "\n"
      "options:\n"
      "  -n, --nproc N        number of ranks (1..%d)\n"
      "  --bind core|none     core (default): pin rank i to the i-th CPU (mod count) of the CPUs\n"
      "                       comm-run may use, as mpirun does; none: do not pin\n"
      "  --timeout-s S        stop the job after S seconds (exit 124); 0 (default): no limit\n"
      "  --grace-s S          after SIGTERM, wait S seconds (default 5) before SIGKILL\n"
      "  --prefix             prefix every output line with \"[rank] \", even with one rank\n"
      "  --quiet-prefix       leave rank 0's lines as they are, prefix the other ranks' lines: keeps\n"
      "                       rank-0-only output such as comm-bench's table parseable\n"
      "  --no-prefix          no prefixes; the ranks write straight to comm-run's stdout/stderr\n"
      "  --replace-failed     keep the job going when a rank is lost: comm-run serves the job's store\n"
      "                       (the ranks get COMM_STORE_EXTERNAL=1), leaves the others running when one\n"
      "                       fails, and for each rank the survivors exclude (comm_agree_failed) SIGKILLs\n"
      "                       its process if still alive, then starts a replacement in its slot with\n"
      "                       COMM_JOIN=1, which joins at the survivors' next comm_grow\n"
      "  --params             print libcomm's parameters (environment variables) and exit\n"
      "  --version            libcomm's release and git commit\n"
      "  -h, --help           this text\n"
      "\n"
      "Output: by default, with N > 1 every line of stdout and stderr is prefixed with \"[rank] \"\n"
      "(line-buffered; a last line without a newline is still printed); with N = 1 nothing is.\n"
      "Ranks run in their own process groups with stdin from /dev/null.\n"
      "\n"
      "Signals: SIGINT, SIGTERM and SIGHUP are forwarded to every rank; a second one, or the grace\n"
      "period running out, sends SIGKILL. When a rank exits non-zero or dies by a signal, the others\n"
      "get SIGTERM, then SIGKILL after the grace period.\n"
      "\n"
      "Exit status: 0 when every rank exits 0; otherwise the first failing rank's exit status\n"
      "(128+signal when it was killed), 124 on --timeout-s, 128+signal when interrupted. With\n"
      "--replace-failed: 0 when every slot's last process exited 0, else the first such slot's status.\n",
      kMaxRanks);
}

namespace {

// The option getopt refused: "-x" for a short one (optopt), else the argument itself (a long one).
std::string bad_option(char** argv) {
  if (optopt != 0) return std::string("-") + static_cast<char>(optopt);
  return argv[optind - 1];
}

bool parse_number(const char* text, double min, double max, double* out) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !(v >= min && v <= max)) return false;
  *out = v;
  return true;
}

}  // namespace

int parse_options(int argc, char** argv, Options* opt) {
  enum { kBind = 256, kTimeout, kGrace, kPrefix, kQuiet, kNoPrefix, kParams, kVersion, kReplace };
  const option longopts[] = {
      {"nproc", required_argument, nullptr, 'n'},
      {"nproc-per-node", required_argument, nullptr, 'n'},
      {"bind", required_argument, nullptr, kBind},
      {"timeout-s", required_argument, nullptr, kTimeout},
      {"grace-s", required_argument, nullptr, kGrace},
      {"prefix", no_argument, nullptr, kPrefix},
      {"quiet-prefix", no_argument, nullptr, kQuiet},
      {"no-prefix", no_argument, nullptr, kNoPrefix},
      {"params", no_argument, nullptr, kParams},
      {"replace-failed", no_argument, nullptr, kReplace},
      {"version", no_argument, nullptr, kVersion},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  // '+': stop at the first non-option, so PROGRAM's own options are left alone. ':' and opterr 0:
  // a bad option gets one line of ours, not getopt's and the whole usage.
  opterr = 0;
  for (;;) {
    int c = getopt_long(argc, argv, "+:n:h", longopts, nullptr);
    if (c == -1) break;
    double v = 0;
    switch (c) {
      case 'n':
        if (!parse_number(optarg, 1, kMaxRanks, &v) || v != static_cast<int>(v)) {
          std::fprintf(stderr, "comm-run: -n %s: expected a whole number of ranks in 1..%d\n", optarg, kMaxRanks);
          return 2;
        }
        opt->nranks = static_cast<int>(v);
        break;
      case kBind:
        if (std::strcmp(optarg, "core") == 0) {
          opt->bind = Bind::kCore;
        } else if (std::strcmp(optarg, "none") == 0) {
          opt->bind = Bind::kNone;
        } else {
          std::fprintf(stderr, "comm-run: --bind %s: expected core or none\n", optarg);
          return 2;
        }
        break;
      case kTimeout:
        if (!parse_number(optarg, 0, 1e9, &opt->timeout_s)) {
          std::fprintf(stderr, "comm-run: --timeout-s %s: expected seconds >= 0\n", optarg);
          return 2;
        }
        break;
      case kGrace:
        if (!parse_number(optarg, 0, 3600, &opt->grace_s)) {
          std::fprintf(stderr, "comm-run: --grace-s %s: expected seconds in 0..3600\n", optarg);
          return 2;
        }
        break;
      case kPrefix: opt->prefix = Prefix::kAlways; break;
      case kQuiet: opt->prefix = Prefix::kQuiet; break;
      case kNoPrefix: opt->prefix = Prefix::kNone; break;
      case kParams: opt->print_params = true; break;
      case kReplace: opt->replace_failed = true; break;
      case kVersion: std::printf("comm-run (libcomm %s)\n", comm::version::text()); return 0;
      case 'h': usage(stdout); return 0;
      case ':': std::fprintf(stderr, "comm-run: %s needs a value; see --help\n", argv[optind - 1]); return 2;
      default: std::fprintf(stderr, "comm-run: unknown option '%s'; see --help\n", bad_option(argv).c_str()); return 2;
    }
  }
  if (opt->print_params) return -1;
  if (opt->nranks == 0) {
    std::fprintf(stderr, "comm-run: -n N is required\n");
    usage(stderr);
    return 2;
  }
  if (optind >= argc) {
    std::fprintf(stderr, "comm-run: no program given\n");
    usage(stderr);
    return 2;
  }
  opt->program.assign(argv + optind, argv + argc);
  opt->program.push_back(nullptr);
  return -1;
}

}  // namespace comm_run

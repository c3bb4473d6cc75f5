// comm-bench: all-reduce bandwidth in nccl-tests' format, through the public C ABI only.
//
// Same flags, columns and footer as nccl-tests' all_reduce_perf, so the scripts that read
// those logs read these. Rank and size come from the launcher's environment (env://), so it
// runs under comm-run, torchrun, mpirun and srun alike. Only rank 0 prints; every line that is
// not a table row starts with '#'.
//
// Inputs are a function of (seed, rank, index) chosen so that every partial result is an exact
// small integer in every dtype: each rank computes the expected output itself, and an exact
// (bitwise) compare is valid for floating point too.

#include <comm/comm.h>
#include <getopt.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Options {
  size_t min_bytes = 32 << 20;  // nccl-tests' defaults
  size_t max_bytes = 32 << 20;
  size_t step_bytes = 1 << 20;
  size_t step_factor = 1;
  int iters = 20;
  int warmup_iters = 5;
  int check = 1;  // how many checked runs per size (0: none)
  comm_dtype_t dtype = COMM_FLOAT32;
  comm_op_t op = COMM_SUM;
};

enum class Kind { kSigned, kUnsigned, kFloat, kDouble, kHalf, kBfloat16 };

struct DtypeInfo {
  const char* name;  // as nccl-tests prints it
  const char* alias;
  comm_dtype_t dtype;
  size_t bytes;
  Kind kind;
  double exact_limit;  // largest integer up to which every integer is representable
};

constexpr DtypeInfo kDtypes[] = {
    {"float", "float32", COMM_FLOAT32, 4, Kind::kFloat, 16777216.0},
    {"double", "float64", COMM_FLOAT64, 8, Kind::kDouble, 9007199254740992.0},
    {"half", "float16", COMM_FLOAT16, 2, Kind::kHalf, 2048.0},
    {"bfloat16", "bf16", COMM_BFLOAT16, 2, Kind::kBfloat16, 256.0},
    {"int8", "char", COMM_INT8, 1, Kind::kSigned, 0},
    {"uint8", "uchar", COMM_UINT8, 1, Kind::kUnsigned, 0},
    {"int32", "int", COMM_INT32, 4, Kind::kSigned, 0},
    {"uint32", "uint", COMM_UINT32, 4, Kind::kUnsigned, 0},
    {"int64", "long", COMM_INT64, 8, Kind::kSigned, 0},
    {"uint64", "ulong", COMM_UINT64, 8, Kind::kUnsigned, 0},
};
constexpr const char* kOpNames[] = {"sum", "prod", "min", "max", "avg"};

const DtypeInfo& info_of(comm_dtype_t dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d;
  return kDtypes[0];
}

void usage(FILE* out, const char* argv0) {
  std::fprintf(out,
      "USAGE: %s\n"
      "\t[-b,--minbytes <min size in bytes>] (8, 1K, 64M, 1G; default 32M)\n"
      "\t[-e,--maxbytes <max size in bytes>] (default 32M)\n"
      "\t[-i,--stepbytes <increment size>] (used when the step factor is 1; default 1M)\n"
      "\t[-f,--stepfactor <increment factor>] (default 1)\n"
      "\t[-n,--iters <iteration count>] (default 20)\n"
      "\t[-w,--warmup_iters <warmup iteration count>] (default 5)\n"
      "\t[-c,--check <check iteration count>] (0: no check; default 1)\n"
      "\t[-o,--op <sum/prod/min/max/avg>] (default sum)\n"
      "\t[-d,--datatype <float/double/half/bfloat16/int8/uint8/int32/uint32/int64/uint64>]\n"
      "\t[-h,--help]\n"
      "Rank and size come from the launcher (env://): run it under comm-run, torchrun, mpirun or srun.\n",
      argv0);
}

// "8", "1K", "64M", "1G" (binary units, as nccl-tests); a trailing 'B' is allowed.
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

bool parse_int(const char* text, long min, long max, long* out) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 0);
  if (end == text || *end != '\0' || v < min || v > max) return false;
  *out = v;
  return true;
}

// Returns -1 to go on, otherwise the exit status for main.
int parse_options(int argc, char** argv, Options* opt) {
  const option longopts[] = {
      {"minbytes", required_argument, nullptr, 'b'},   {"maxbytes", required_argument, nullptr, 'e'},
      {"stepbytes", required_argument, nullptr, 'i'},  {"stepfactor", required_argument, nullptr, 'f'},
      {"iters", required_argument, nullptr, 'n'},      {"warmup_iters", required_argument, nullptr, 'w'},
      {"check", required_argument, nullptr, 'c'},      {"op", required_argument, nullptr, 'o'},
      {"datatype", required_argument, nullptr, 'd'},   {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  for (;;) {
    int c = getopt_long(argc, argv, "b:e:i:f:n:w:c:o:d:h", longopts, nullptr);
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
      case 'o': {
        ok = false;
        for (int i = 0; i < COMM_NUM_OPS; ++i) {
          if (std::strcmp(optarg, kOpNames[i]) == 0) {
            opt->op = static_cast<comm_op_t>(i);
            ok = true;
          }
        }
        break;
      }
      case 'd': {
        ok = false;
        for (const auto& d : kDtypes) {
          if (std::strcmp(optarg, d.name) == 0 || std::strcmp(optarg, d.alias) == 0) {
            opt->dtype = d.dtype;
            ok = true;
          }
        }
        break;
      }
      case 'h': usage(stdout, argv[0]); return 0;
      default: usage(stderr, argv[0]); return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "# comm-bench: invalid value '%s' for -%c\n", optarg, c);
      return 2;
    }
  }
  if (optind < argc) {
    std::fprintf(stderr, "# comm-bench: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (opt->min_bytes > opt->max_bytes) {
    std::fprintf(stderr, "# comm-bench: invalid sizes for 'minbytes' and 'maxbytes': %zu > %zu\n", opt->min_bytes,
                 opt->max_bytes);
    return 2;
  }
  if (opt->step_factor == 1 && opt->step_bytes == 0) {
    std::fprintf(stderr, "# comm-bench: -f 1 needs -i > 0\n");
    return 2;
  }
  return -1;
}

// ---- values that are exact in every dtype ----

uint16_t float_to_half(float f) {  // round to nearest even
  uint32_t x = 0;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (abs < 0x38800000u) {                                                // below 2^-14: subnormal
    float a = 0;
    std::memcpy(&a, &abs, 4);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  uint32_t h = ((((abs >> 23) - 127 + 15) << 10) | ((abs & 0x7fffffu) >> 13));
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

uint16_t float_to_bfloat16(float f) {  // round to nearest even
  uint32_t x = 0;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// Writes `v` (an exact value) into one element of the dtype.
void store(const DtypeInfo& d, double v, uint64_t bits_if_integer, void* dst) {
  switch (d.kind) {
    case Kind::kSigned:
    case Kind::kUnsigned: std::memcpy(dst, &bits_if_integer, d.bytes); break;  // little endian: low bytes
    case Kind::kFloat: {
      float f = static_cast<float>(v);
      std::memcpy(dst, &f, 4);
      break;
    }
    case Kind::kDouble: std::memcpy(dst, &v, 8); break;
    case Kind::kHalf: {
      uint16_t h = float_to_half(static_cast<float>(v));
      std::memcpy(dst, &h, 2);
      break;
    }
    case Kind::kBfloat16: {
      uint16_t h = float_to_bfloat16(static_cast<float>(v));
      std::memcpy(dst, &h, 2);
      break;
    }
  }
}

constexpr size_t kPeriod = 17;  // inputs repeat every 17 elements

// The largest input value that keeps every partial result exact on `nranks` ranks. Integers
// wrap, which is exact in any order, so only floating point needs a bound.
uint64_t value_bound(const DtypeInfo& d, comm_op_t op, int nranks) {
  uint64_t m = 64;
  if (d.exact_limit == 0 || op == COMM_MIN || op == COMM_MAX) return m;
  auto fits = [&](uint64_t v) {
    if (op == COMM_PROD) return std::pow(static_cast<double>(v), nranks) <= d.exact_limit;
    return static_cast<double>(v) * nranks <= d.exact_limit;
  };
  while (m > 1 && !fits(m)) --m;
  return m;
}

uint64_t input_value(uint64_t seed, int rank, size_t index, uint64_t bound) {
  return 1 + ((static_cast<uint64_t>(rank) + 1) * (index % kPeriod + 1) + seed) % bound;
}

// One period of rank `rank`'s input.
std::vector<unsigned char> input_period(const DtypeInfo& d, uint64_t seed, int rank, uint64_t bound) {
  std::vector<unsigned char> out(kPeriod * d.bytes);
  for (size_t i = 0; i < kPeriod; ++i) {
    uint64_t v = input_value(seed, rank, i, bound);
    store(d, static_cast<double>(v), v, out.data() + i * d.bytes);
  }
  return out;
}

// One period of the expected all-reduce result, as libcomm defines each op (DESIGN.md).
std::vector<unsigned char> expected_period(const DtypeInfo& d, comm_op_t op, uint64_t seed, int nranks,
                                           uint64_t bound) {
  std::vector<unsigned char> out(kPeriod * d.bytes);
  const unsigned bits = static_cast<unsigned>(d.bytes * 8);
  for (size_t i = 0; i < kPeriod; ++i) {
    uint64_t acc = input_value(seed, 0, i, bound);  // modular for integers, exact for floats
    double exact = static_cast<double>(acc);
    for (int r = 1; r < nranks; ++r) {
      uint64_t v = input_value(seed, r, i, bound);
      switch (op) {
        case COMM_SUM:
        case COMM_AVG: acc += v; exact += static_cast<double>(v); break;
        case COMM_PROD: acc *= v; exact *= static_cast<double>(v); break;
        case COMM_MIN: acc = std::min(acc, v); exact = static_cast<double>(acc); break;
        case COMM_MAX: acc = std::max(acc, v); exact = static_cast<double>(acc); break;
      }
    }
    if (op == COMM_AVG) {
      if (d.kind == Kind::kSigned || d.kind == Kind::kUnsigned) {
        // The wrapped sum in the type, divided by the rank count, truncated toward zero.
        uint64_t wrapped = bits == 64 ? acc : acc & ((uint64_t{1} << bits) - 1);
        if (d.kind == Kind::kSigned) {
          int64_t s = bits == 64 ? static_cast<int64_t>(wrapped)
                                 : static_cast<int64_t>(wrapped << (64 - bits)) >> (64 - bits);
          acc = static_cast<uint64_t>(s / nranks);
        } else {
          acc = wrapped / static_cast<uint64_t>(nranks);
        }
      } else if (d.kind == Kind::kDouble) {
        exact = exact / nranks;
      } else {
        exact = static_cast<double>(static_cast<float>(exact) / static_cast<float>(nranks));  // in fp32
      }
    }
    store(d, exact, acc, out.data() + i * d.bytes);
  }
  return out;
}

void fill_periodic(unsigned char* dst, size_t bytes, const std::vector<unsigned char>& period) {
  size_t done = std::min(bytes, period.size());
  std::memcpy(dst, period.data(), done);
  while (done < bytes) {  // doubling copies of what is already there (a whole number of periods)
    size_t n = std::min(done, bytes - done);
    std::memcpy(dst + done, dst, n);
    done += n;
  }
}

int64_t count_wrong(const unsigned char* got, size_t count, size_t elem, const std::vector<unsigned char>& period) {
  int64_t wrong = 0;
  const unsigned char* want = period.data();
  for (size_t i = 0, p = 0; i < count; ++i, p = (p + 1 == kPeriod ? 0 : p + 1))
    wrong += std::memcmp(got + i * elem, want + p * elem, elem) != 0;
  return wrong;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<unsigned char, FreeDeleter>;

Buffer allocate_touched(size_t bytes) {
  size_t rounded = std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096);
  Buffer b(static_cast<unsigned char*>(std::aligned_alloc(4096, rounded)));
  if (b) std::memset(b.get(), 0, rounded);  // first touch here, never inside a timed loop
  return b;
}

std::string cpu_list() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "?";
  std::string out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    int last = c;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
    if (!out.empty()) out += ',';
    out += std::to_string(c);
    if (last > c) {
      out += '-';  // not "-" + to_string(): GCC 12 -O3 warns falsely (-Wrestrict) on that
      out += std::to_string(last);
    }
    c = last;
  }
  return out;
}

std::string format_time(double us) {  // nccl-tests' precision steps
  char text[32];
  if (us >= 10000.0) {
    std::snprintf(text, sizeof text, "%7.0f", us);
  } else if (us >= 100.0) {
    std::snprintf(text, sizeof text, "%7.1f", us);
  } else {
    std::snprintf(text, sizeof text, "%7.2f", us);
  }
  return text;
}

class Bench {
 public:
  explicit Bench(const Options& opt) : opt_(opt), dtype_(info_of(opt.dtype)) {}
  ~Bench() {
    if (comm_ != nullptr) comm_destroy(comm_);
  }
  int run();

 private:
  // False (after a '#' line naming the call and libcomm's message) when a call failed. The
  // communicator is aborted then, so the other ranks fail fast instead of waiting for a timeout.
  bool ok(comm_status_t s, const char* what) {
    if (s == COMM_OK) return true;
    std::fprintf(stderr, "# comm-bench: rank %d: %s failed: %s: %s\n", rank_, what, comm_status_string(s),
                 comm_last_error(comm_));
    comm_abort(comm_);
    return false;
  }
  bool print_header();
  bool time_one(size_t count, bool in_place, double* seconds);
  bool check_one(size_t count, bool in_place, uint64_t seed, int64_t* wrong);

  const Options& opt_;
  const DtypeInfo& dtype_;
  comm_t comm_ = nullptr;
  int rank_ = -1;
  int nranks_ = 0;
  Buffer send_, recv_;
};

bool Bench::print_header() {
  int major = 0;
  int minor = 0;
  comm_get_version(&major, &minor);
  constexpr size_t kLine = 160;
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  std::vector<char> mine(kLine, '\0');
  std::snprintf(mine.data(), kLine, "#  Rank %2d Group  0 Pid %6d on %10s device host cpus %s", rank_,
                static_cast<int>(getpid()), host, cpu_list().c_str());
  std::vector<char> all(kLine * static_cast<size_t>(nranks_), '\0');
  if (!ok(comm_allgather(comm_, mine.data(), all.data(), kLine, COMM_UINT8, nullptr), "comm_allgather")) return false;
  if (rank_ != 0) return true;

  const char* transport = std::getenv("COMM_TRANSPORT");
  const char* algo = std::getenv("COMM_ALGO");
  std::printf("# libcomm %d.%d comm-bench: allreduce, %d ranks\n", major, minor, nranks_);
  std::printf("# nThread 1 nGpus 0 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: 1 "
              "validation: %d graph: 0\n",
              opt_.min_bytes, opt_.max_bytes, opt_.step_factor > 1 ? opt_.step_factor : opt_.step_bytes,
              opt_.step_factor > 1 ? "factor" : "bytes", opt_.warmup_iters, opt_.iters, opt_.check);
  std::printf("# transport: %s\n", transport != nullptr && *transport != '\0' ? transport : "auto");
  std::printf("# algorithm: %s\n", algo != nullptr && *algo != '\0' ? algo : "auto (by size)");
  std::printf("# buffers: host memory, touched before timing; time: mean of %d iterations after %d warm-up, max "
              "over ranks\n",
              opt_.iters, opt_.warmup_iters);
  std::printf("#\n# Using devices\n");
  for (int r = 0; r < nranks_; ++r) {
    const char* line = all.data() + static_cast<size_t>(r) * kLine;
    std::printf("%.*s\n", static_cast<int>(strnlen(line, kLine)), line);
  }
  std::printf("#\n");
  std::printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "",
              "", "", "");
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type", "redop",
              "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "", "", "",
              "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  return true;
}

bool Bench::time_one(size_t count, bool in_place, double* seconds) {
  const void* send = in_place ? recv_.get() : send_.get();
  if (!ok(comm_barrier(comm_, nullptr), "comm_barrier")) return false;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < opt_.iters; ++i)
    if (!ok(comm_allreduce(comm_, send, recv_.get(), count, opt_.dtype, opt_.op, nullptr), "comm_allreduce"))
      return false;
  double local = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / opt_.iters;
  // The slowest rank is the collective's time.
  return ok(comm_allreduce(comm_, &local, seconds, 1, COMM_FLOAT64, COMM_MAX, nullptr), "comm_allreduce (time)");
}

bool Bench::check_one(size_t count, bool in_place, uint64_t seed, int64_t* wrong) {
  const size_t bytes = count * dtype_.bytes;
  const uint64_t bound = value_bound(dtype_, opt_.op, nranks_);
  unsigned char* input = in_place ? recv_.get() : send_.get();
  fill_periodic(input, bytes, input_period(dtype_, seed, rank_, bound));
  if (!in_place) std::memset(recv_.get(), 0xff, bytes);  // stale output must not pass the check
  if (!ok(comm_allreduce(comm_, input, recv_.get(), count, opt_.dtype, opt_.op, nullptr), "comm_allreduce")) return false;
  int64_t local = count_wrong(recv_.get(), count, dtype_.bytes, expected_period(dtype_, opt_.op, seed, nranks_, bound));
  return ok(comm_allreduce(comm_, &local, wrong, 1, COMM_INT64, COMM_SUM, nullptr), "comm_allreduce (#wrong)");
}

int Bench::run() {
  comm_config_t cfg = COMM_CONFIG_INIT;
  if (comm_status_t s = comm_init(&cfg, &comm_); s != COMM_OK) {
    std::fprintf(stderr, "# comm-bench: comm_init failed: %s: %s\n", comm_status_string(s), comm_last_error(nullptr));
    comm_ = nullptr;
    return 1;
  }
  if (!ok(comm_rank(comm_, &rank_), "comm_rank") || !ok(comm_size(comm_, &nranks_), "comm_size")) return 1;

  send_ = allocate_touched(opt_.max_bytes);
  recv_ = allocate_touched(opt_.max_bytes);
  if (!send_ || !recv_) {
    std::fprintf(stderr, "# comm-bench: rank %d: cannot allocate 2 x %zu bytes\n", rank_, opt_.max_bytes);
    comm_abort(comm_);
    return 1;
  }
  if (!print_header()) return 1;
  fill_periodic(send_.get(), opt_.max_bytes / dtype_.bytes * dtype_.bytes,
                input_period(dtype_, 0, rank_, value_bound(dtype_, opt_.op, nranks_)));

  // Warm-up at the largest and the smallest size, as nccl-tests does.
  for (size_t bytes : {opt_.max_bytes, opt_.min_bytes})
    for (int i = 0; i < opt_.warmup_iters; ++i)
      if (!ok(comm_allreduce(comm_, send_.get(), recv_.get(), bytes / dtype_.bytes, opt_.dtype, opt_.op, nullptr),
              "comm_allreduce (warm-up)"))
        return 1;

  const double bus_factor = 2.0 * (nranks_ - 1) / nranks_;
  double bw_sum = 0;
  int bw_count = 0;
  int errors = 0;
  uint64_t seed = 0;
  for (size_t size = opt_.min_bytes; size <= opt_.max_bytes;) {
    const size_t count = size / dtype_.bytes;
    const size_t bytes = count * dtype_.bytes;
    char row[512];
    int len = std::snprintf(row, sizeof row, "%12zu  %12zu  %8s  %6s  %6d", bytes, count, dtype_.name,
                            kOpNames[opt_.op], -1);
    for (bool in_place : {false, true}) {
      double seconds = 0;
      if (!time_one(count, in_place, &seconds)) return 1;
      int64_t wrong = opt_.check > 0 ? 0 : -1;
      for (int c = 0; c < opt_.check && wrong == 0; ++c)
        if (!check_one(count, in_place, ++seed, &wrong)) return 1;
      if (wrong > 0) ++errors;
      const double algbw = seconds > 0 ? static_cast<double>(bytes) / 1e9 / seconds : 0;
      const double busbw = algbw * bus_factor;
      bw_sum += busbw;
      ++bw_count;
      len += std::snprintf(row + len, sizeof row - static_cast<size_t>(len), "  %7s  %6.2f  %6.2f  %5lld",
                           format_time(seconds * 1e6).c_str(), algbw, busbw, static_cast<long long>(wrong));
    }
    if (rank_ == 0) std::printf("%s\n", row);
    if (opt_.step_factor > 1) {
      if (size > opt_.max_bytes / opt_.step_factor) break;   // the next size is past the end
      size = std::max(size * opt_.step_factor, size + 1);  // from 0, factors alone never move
    } else {
      if (opt_.max_bytes - size < opt_.step_bytes) break;
      size += opt_.step_bytes;
    }
  }
  if (rank_ == 0) {
    std::printf("# Out of bounds values : %d %s\n", errors, errors != 0 ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g \n", bw_count > 0 ? bw_sum / bw_count : 0.0);
    std::printf("#\n");
  }
  if (!ok(comm_destroy(comm_), "comm_destroy")) {
    comm_ = nullptr;
    return 1;
  }
  comm_ = nullptr;
  return errors != 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // every line visible as it is printed, as nccl-tests does
  Options opt;
  if (int code = parse_options(argc, argv, &opt); code >= 0) return code;
  Bench bench(opt);
  return bench.run();
}

// One size at a time: time `iters` calls out of place, then in place (nccl-tests' order), and
// after each timing refill the inputs for `seed` and check every element of the output.
#include "engine.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>
#include <set>
#include <string>
#include <vector>

#include "collectives.h"
#include "options.h"
#include "results.h"
#include "values.h"

namespace bench {
namespace {

using Clock = std::chrono::steady_clock;

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

// What tells hosts apart (docs/design/base.md, "What tells hosts apart"): boot id and network namespace, so that simulated hosts
// (netsim's namespaces) count as hosts.
std::string host_identity() {
  std::string boot = "?";
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char text[64] = "";
    if (std::fgets(text, sizeof text, f) != nullptr) boot.assign(text, strnlen(text, 8));
    std::fclose(f);
  }
  char ns[64] = "?";
  const ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  ns[n > 0 ? n : 1] = '\0';
  return "boot " + boot + " " + ns;
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

std::vector<size_t> sizes_of(const Options& opt) {
  std::vector<size_t> out;
  for (size_t size = opt.min_bytes; size <= opt.max_bytes;) {
    out.push_back(size);
    if (opt.step_factor > 1) {
      if (size > opt.max_bytes / opt.step_factor) break;  // the next size is past the end
      size = std::max(size * opt.step_factor, size + 1);  // from 0, factors alone never move
    } else {
      if (opt.max_bytes - size < opt.step_bytes) break;
      size += opt.step_bytes;
    }
  }
  return out;
}

// COMM_BENCH_CORRUPT=RANK:INDEX (test only): that rank flips one byte of output element INDEX
// after every checked call, so a test can see that the check counts it.
struct Corruption {
  int rank = -1;
  size_t index = 0;
};

Corruption corruption_from_env() {
  Corruption c;
  const char* v = std::getenv("COMM_BENCH_CORRUPT");
  if (v == nullptr || *v == '\0') return c;
  int rank = -1;
  unsigned long long index = 0;
  if (std::sscanf(v, "%d:%llu", &rank, &index) == 2) {
    c.rank = rank;
    c.index = static_cast<size_t>(index);
  } else {
    std::fprintf(stderr, "# comm-bench: ignoring COMM_BENCH_CORRUPT='%s' (want RANK:INDEX)\n", v);
  }
  return c;
}

// "  2026-12-02 02:40:11": nccl-tests' -S column (local time, right-aligned in 21).
std::string timestamp_now() {
  char text[64] = "";
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof out, "%21s", text);
  return out;
}

// Every COMM_* and NCCL_* variable set, for the JSON record; secrets are named, not shown.
std::vector<std::pair<std::string, std::string>> environment_set() {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (entry.rfind("COMM_", 0) != 0 && entry.rfind("NCCL_", 0) != 0) continue;
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    std::string name = entry.substr(0, eq);
    std::string value = entry.substr(eq + 1);
    if (name.find("TOKEN") != std::string::npos || name.find("SECRET") != std::string::npos ||
        name.find("PASSWORD") != std::string::npos)
      value = "(set, not recorded)";
    out.emplace_back(std::move(name), std::move(value));
  }
  std::sort(out.begin(), out.end());
  return out;
}

class Engine {
 public:
  Engine(const Options& opt, const char* prog, Backend& b) : opt_(opt), prog_(prog), b_(b) {}
  ~Engine() { release_buffers(); }
  int run();

 private:
  bool fail(const char* what) {
    std::fprintf(stderr, "# %s: rank %d: %s failed: %s\n", prog_, rank_, what, b_.error().c_str());
    b_.abort();
    return false;
  }
  bool allocate();
  void release_buffers() {
    if (send_ != nullptr) b_.release(send_, opt_.registered);
    if (recv_ != nullptr) b_.release(recv_, opt_.registered);
    send_ = recv_ = nullptr;
  }
  bool print_header();
  bool warm_up();
  bool measure(const DtypeInfo& d, comm_op_t op, size_t size, bool in_place, uint64_t* seed, Measure* m);
  bool reduce_time(double local, double* seconds);
  bool check_output_paths();
  void memory_report();
  Call call_for(const DtypeInfo& d, comm_op_t op, const Counts& k, bool in_place) const;
  void progress(size_t done, size_t total, double last_row_s, size_t last_size, size_t remaining_bytes_units);

  const Options& opt_;
  const char* prog_;
  Backend& b_;
  int rank_ = 0;
  int nranks_ = 1;
  unsigned char* send_ = nullptr;
  unsigned char* recv_ = nullptr;
  size_t send_bytes_ = 0;
  size_t recv_bytes_ = 0;
  Corruption corrupt_ = corruption_from_env();
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_progress_ = start_;
};

bool Engine::allocate() {
  for (comm_dtype_t dt : opt_.dtypes) {
    const DtypeInfo& d = dtype_info(dt);
    Counts k = opt_.coll->counts(opt_.max_bytes / d.bytes, nranks_);
    // In place, one buffer holds the input and the output: both get room for the larger.
    send_bytes_ = std::max({send_bytes_, k.send * d.bytes, k.recv * d.bytes});
  }
  recv_bytes_ = send_bytes_;
  // At least one page each, so that buffer pointers are never NULL even for size 0.
  send_bytes_ = std::max<size_t>(send_bytes_, 4096);
  recv_bytes_ = std::max<size_t>(recv_bytes_, 4096);
  send_ = static_cast<unsigned char*>(b_.alloc(send_bytes_, opt_.registered));
  recv_ = static_cast<unsigned char*>(b_.alloc(recv_bytes_, opt_.registered));
  if (send_ == nullptr || recv_ == nullptr) {
    std::fprintf(stderr, "# %s: rank %d: cannot allocate %zu + %zu bytes%s: %s\n", prog_, rank_, send_bytes_,
                 recv_bytes_, opt_.registered ? " (-R 1)" : "", b_.error().c_str());
    b_.abort();
    return false;
  }
  std::memset(send_, 0, send_bytes_);  // first touch here, never inside a timed loop
  std::memset(recv_, 0, recv_bytes_);
  return true;
}

// --json/--csv/-J checked before anything runs: a sweep of minutes whose results cannot be
// written is lost. Rank 0 writes them, so rank 0 checks and every rank learns the verdict.
bool Engine::check_output_paths() {
  std::string why;
  if (rank_ == 0) {
    for (const auto& [flag, path] : {std::pair<std::string, std::string>{"--json", opt_.json_path},
                                     {"--csv", opt_.csv_path}}) {
      if (!path.empty() && why.empty()) why = check_writable(flag, path);
    }
  }
  // Said before the verdict is shared: the other ranks exit as soon as they learn it, and a
  // launcher (comm-run) then stops rank 0, which could otherwise die before it says why.
  if (!why.empty()) std::fprintf(stderr, "# %s: %s\n", prog_, why.c_str());
  double bad = 0;
  if (!b_.reduce_value(why.empty() ? 0.0 : 1.0, COMM_SUM, &bad)) return fail("sharing the output check");
  if (bad == 0) return true;
  (void)b_.finish();
  return false;
}

// -M 1: what the buffers take and the largest resident set over ranks (host memory; nccl-tests
// reports device memory, which a host-buffer run does not use).
void Engine::memory_report() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  double peak = static_cast<double>(ru.ru_maxrss) * 1024.0, max_peak = 0;
  if (!b_.reduce_value(peak, COMM_MAX, &max_peak)) return;
  if (rank_ == 0)
    std::printf("# Memory: buffers %zu bytes per rank (send %zu + receive %zu), peak resident %.1f MiB (max over "
                "ranks)\n#\n",
                send_bytes_ + recv_bytes_, send_bytes_, recv_bytes_, max_peak / (1024.0 * 1024.0));
}

bool Engine::print_header() {
  constexpr size_t kLine = 160;
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  std::vector<char> mine(kLine, '\0');
  std::snprintf(mine.data(), kLine, "#  Rank %2d Group  0 Pid %6d on %10s device host cpus %s %s", rank_,
                static_cast<int>(getpid()), host, cpu_list().c_str(), host_identity().c_str());
  std::vector<char> all(kLine * static_cast<size_t>(nranks_), '\0');
  if (!b_.gather_bytes(mine.data(), kLine, all.data())) return fail("gathering the header");
  if (rank_ != 0) return true;

  std::set<std::string> hosts;  // hostname and identity, without rank, pid and cpus
  for (int r = 0; r < nranks_; ++r) {
    std::string line(all.data() + static_cast<size_t>(r) * kLine, strnlen(all.data() + static_cast<size_t>(r) * kLine, kLine));
    const size_t on = line.find(" on ");
    const size_t cpus = line.find(" cpus ");
    const size_t id = line.rfind(" boot ");
    hosts.insert(line.substr(on, cpus - on) + (id != std::string::npos ? line.substr(id) : ""));
  }
  std::printf("# %s %s: %s, %d ranks on %zu host%s\n", b_.library().c_str(), prog_, opt_.coll->name, nranks_,
              hosts.size(), hosts.size() == 1 ? "" : "s");
  // nccl-tests' line, field for field: nGpus counts devices this rank drives, graph the -G launches.
  std::printf("# nThread 1 nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: %d "
              "validation: %d graph: %d\n",
              opt_.device ? 1 : 0, opt_.min_bytes, opt_.max_bytes,
              opt_.step_factor > 1 ? opt_.step_factor : opt_.step_bytes, opt_.step_factor > 1 ? "factor" : "bytes",
              opt_.warmup_iters, opt_.iters, opt_.agg_iters, opt_.check, opt_.graph_launches);
  if (opt_.blocking) std::printf("# Blocking Enabled: wait for completion and barrier after each collective \n");
  if (const std::string v = b_.version(); !v.empty()) std::printf("# version: %s %s\n", b_.library().c_str(), v.c_str());
  std::printf("# transport: %s\n", b_.transport().c_str());
  std::printf("# algorithm: %s\n", b_.algorithm().c_str());
  static const char* kAverage[] = {"rank 0's", "mean over ranks", "min over ranks", "max over ranks"};
  const char* buffers = opt_.device       ? (opt_.stream_null ? "device (--device 1: CUDA managed memory, the default stream, -y 1)"
                                                                : "device (--device 1: CUDA managed memory, one stream)")
                        : opt_.registered ? "library-allocated (-R 1)"
                                          : "host memory (malloc)";
  std::printf("# buffers: %s, touched before timing; calls: %s; %s: mean of %d iterations x %d calls after %d warm-up, "
              "%s\n",
              buffers, opt_.blocking ? "blocking (-z 1)" : "issued together, then waited (-z 0)",
              opt_.cputime ? "cputime (-C 1: issuing the calls, not completing them)" : "time", opt_.iters,
              opt_.agg_iters, opt_.warmup_iters, kAverage[static_cast<int>(opt_.average)]);
  std::printf("#\n# Using devices\n");
  for (int r = 0; r < nranks_; ++r) {
    const char* line = all.data() + static_cast<size_t>(r) * kLine;
    std::printf("%.*s\n", static_cast<int>(strnlen(line, kLine)), line);
  }
  std::printf("#\n");
  std::printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "",
              "", "", "");
  const char* time_title = opt_.cputime ? "cputime" : "time";  // -C 1, as nccl-tests names it
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type", "redop",
              "root", time_title, "algbw", "busbw", "#wrong", time_title, "algbw", "busbw", "#wrong");
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "", "", "",
              "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  return true;
}

Call Engine::call_for(const DtypeInfo& d, comm_op_t op, const Counts& k, bool in_place) const {
  Call c;
  c.count = k.param;
  c.dtype = d.dtype;
  c.op = op;
  c.root = opt_.root;
  c.rank = rank_;
  c.nranks = nranks_;
  const size_t r = static_cast<size_t>(rank_);
  if (!in_place) {
    c.send = send_;
    c.recv = recv_;
  } else if (k.send_inplace_offset != 0) {  // allgather: the input is this rank's block of the output
    c.recv = recv_;
    c.send = recv_ + r * k.send_inplace_offset * d.bytes;
  } else {  // reduce_scatter: the output is this rank's block of the input
    c.send = recv_;
    c.recv = recv_ + r * k.recv_inplace_offset * d.bytes;
  }
  return c;
}

bool Engine::warm_up() {
  const DtypeInfo& d = dtype_info(opt_.dtypes.front());
  for (size_t bytes : {opt_.max_bytes, opt_.min_bytes}) {  // as nccl-tests: the largest, then the smallest
    Call c = call_for(d, opt_.ops.front(), opt_.coll->counts(bytes / d.bytes, nranks_), false);
    for (int i = 0; i < opt_.warmup_iters; ++i)
      if (!opt_.coll->run(b_, c)) return fail("warm-up");
  }
  return b_.barrier() || fail("barrier");
}

// One rank's seconds per call, reduced over ranks by -a.
bool Engine::reduce_time(double local, double* seconds) {
  switch (opt_.average) {
    case Average::kRank0:
      if (!b_.reduce_value(rank_ == 0 ? local : 0.0, COMM_SUM, seconds)) return fail("reducing the time");
      break;
    case Average::kMean:
      if (!b_.reduce_value(local, COMM_SUM, seconds)) return fail("reducing the time");
      *seconds /= nranks_;
      break;
    case Average::kMin:
      if (!b_.reduce_value(local, COMM_MIN, seconds)) return fail("reducing the time");
      break;
    case Average::kMax:
      if (!b_.reduce_value(local, COMM_MAX, seconds)) return fail("reducing the time");
      break;
  }
  return true;
}

bool Engine::measure(const DtypeInfo& d, comm_op_t op, size_t size, bool in_place, uint64_t* seed, Measure* m) {
  const Counts k = opt_.coll->counts(size / d.bytes, nranks_);
  const Call c = call_for(d, op, k, in_place);

  if (!b_.barrier()) return fail("barrier");
  const auto t0 = Clock::now();
  const int calls = opt_.iters * opt_.agg_iters;  // -m: each iteration issues agg_iters calls together
  if (!opt_.blocking && !b_.begin_batch()) return fail("begin_batch");
  for (int i = 0; i < calls; ++i)
    if (!opt_.coll->run(b_, c)) return fail(opt_.coll->name);
  const auto issued = Clock::now();  // -C 1 reports this: the calls issued, not yet complete (as nccl-tests)
  if (!opt_.blocking && !b_.end_batch()) return fail(opt_.coll->name);
  const auto done = Clock::now();
  double seconds = 0;  // to complete the calls: the bandwidths, and the time column
  if (!reduce_time(std::chrono::duration<double>(done - t0).count() / calls, &seconds)) return false;
  double shown = seconds;  // -C 1: the time column is the time to issue them; the bandwidths stay
  if (opt_.cputime && !reduce_time(std::chrono::duration<double>(issued - t0).count() / calls, &shown)) return false;

  m->time_us = shown * 1e6;
  const double bytes = static_cast<double>(k.param * d.bytes) * (opt_.coll->algbw_per_rank ? nranks_ : 1);
  m->algbw = seconds > 0 ? bytes / 1e9 / seconds : 0;
  m->busbw = m->algbw * opt_.coll->busbw_factor(nranks_);
  const bool checked = opt_.check > 0 && (!in_place || opt_.coll->in_place_checked);
  m->wrong = checked ? 0 : -1;

  for (int i = 0; checked && i < opt_.check && m->wrong == 0; ++i) {
    ++*seed;
    std::memset(recv_, 0xff, std::max(k.send, k.recv) * d.bytes);  // stale output must not pass the check
    opt_.coll->init(d, c, *seed, static_cast<unsigned char*>(const_cast<void*>(c.send)));
    if (!opt_.coll->run(b_, c)) return fail(opt_.coll->name);
    if (corrupt_.rank == rank_ && corrupt_.index < k.recv)
      static_cast<unsigned char*>(c.recv)[corrupt_.index * d.bytes] ^= 0x5a;
    const double local_wrong = static_cast<double>(opt_.coll->check(d, c, *seed));
    double wrong = 0;
    if (!b_.reduce_value(local_wrong, COMM_SUM, &wrong)) return fail("reducing #wrong");
    m->wrong = static_cast<int64_t>(wrong);
  }
  return true;
}

void Engine::progress(size_t done, size_t total, double last_row_s, size_t last_size, size_t remaining_bytes) {
  if (rank_ != 0 || done == total) return;
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (elapsed < 3.0 || std::chrono::duration<double>(now - last_progress_).count() < 2.0) return;
  last_progress_ = now;
  // Time grows with bytes once bandwidth dominates; the last row is the best guide there is.
  const double per_byte = last_row_s / static_cast<double>(std::max<size_t>(last_size, 1));
  const double left = std::max(last_row_s * static_cast<double>(total - done), per_byte * static_cast<double>(remaining_bytes));
  std::fprintf(stderr, "# progress: %zu/%zu rows, elapsed %.1f s, about %.0f s left\n", done, total, elapsed, left);
}

int Engine::run() {
  rank_ = b_.rank();
  nranks_ = b_.nranks();
  for (comm_dtype_t dt : opt_.dtypes) {
    for (comm_op_t op : opt_.ops) {
      const std::string why = b_.unsupported(opt_.coll->name, dt, opt_.coll->reduces ? op : COMM_SUM);
      if (!why.empty()) {
        if (rank_ == 0) std::fprintf(stderr, "# %s: %s\n", prog_, why.c_str());
        return 2;
      }
    }
  }
  if (opt_.coll->rooted && opt_.root >= nranks_) {
    if (rank_ == 0) std::fprintf(stderr, "# %s: root %d is not a rank (0..%d)\n", prog_, opt_.root, nranks_ - 1);
    return 2;
  }
  if (!check_output_paths()) return 2;
  if (!allocate() || !print_header() || !warm_up()) return 1;

  Run run;
  run.library = b_.library();
  run.version = b_.version();
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  run.host = host;
  run.environment = environment_set();
  run.collective = opt_.coll->name;
  run.transport = b_.transport();
  run.algorithm = b_.algorithm();
  run.label = opt_.label.empty() ? run.library + " " + run.transport : opt_.label;
  run.nranks = nranks_;

  const std::vector<size_t> sizes = sizes_of(opt_);
  const std::vector<comm_op_t> ops = opt_.coll->reduces ? opt_.ops : std::vector<comm_op_t>{COMM_SUM};
  // -N 0 runs until interrupted: no total, so no progress estimate.
  const size_t total = opt_.run_cycles == 0 ? 0 : opt_.dtypes.size() * ops.size() * sizes.size() * opt_.run_cycles;
  size_t done = 0;
  double bw_sum = 0;
  int bw_count = 0;
  uint64_t seed = 0;
  for (int cycle = 0; opt_.run_cycles == 0 || cycle < opt_.run_cycles; ++cycle) {
    for (comm_dtype_t dt : opt_.dtypes) {
      const DtypeInfo& d = dtype_info(dt);
      for (comm_op_t op : ops) {
        for (size_t si = 0; si < sizes.size(); ++si) {
          const auto row_start = Clock::now();
          const Counts k = opt_.coll->counts(sizes[si] / d.bytes, nranks_);
          Row row;
          row.size = std::max(k.send, k.recv) * d.bytes;
          row.count = k.param;
          row.type = d.name;
          row.redop = opt_.coll->reduces ? op_name(op) : "none";
          row.root = opt_.coll->rooted ? opt_.root : -1;
          if (!measure(d, op, sizes[si], false, &seed, &row.out_of_place) ||
              !measure(d, op, sizes[si], true, &seed, &row.in_place))
            return 1;
          if (row.out_of_place.wrong > 0 || row.in_place.wrong > 0) ++run.out_of_bounds;
          for (const Measure* m : {&row.out_of_place, &row.in_place}) {
            bw_sum += m->busbw;
            ++bw_count;
          }
          if (rank_ == 0) {
            std::string line(512, '\0');
            int len = std::snprintf(line.data(), line.size(), "%12zu  %12zu  %8s  %6s  %6d", row.size, row.count,
                                    row.type.c_str(), row.redop.c_str(), row.root);
            for (const Measure* m : {&row.out_of_place, &row.in_place}) {
              const std::string wrong = m->wrong < 0 ? "N/A" : std::to_string(m->wrong);
              len += std::snprintf(line.data() + len, line.size() - static_cast<size_t>(len), "  %7s  %6.2f  %6.2f  %5s",
                                   format_time(m->time_us).c_str(), m->algbw, m->busbw, wrong.c_str());
            }
            line.resize(static_cast<size_t>(len));
            if (opt_.timestamps) line += timestamp_now();  // -S 1: after the in-place columns, as nccl-tests
            std::printf("%s\n", line.c_str());
          }
          if (opt_.run_cycles != 0) run.rows.push_back(row);  // -N 0 would grow without end
          size_t remaining_bytes = 0;
          for (size_t sj = si + 1; sj < sizes.size(); ++sj) remaining_bytes += sizes[sj];
          ++done;
          if (total != 0)
            progress(done, total, std::chrono::duration<double>(Clock::now() - row_start).count(), sizes[si],
                     remaining_bytes);
        }
      }
    }
  }
  run.avg_busbw = bw_count > 0 ? bw_sum / bw_count : 0.0;
  if (rank_ == 0) {
    std::printf("# Out of bounds values : %d %s\n", run.out_of_bounds, run.out_of_bounds != 0 ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g \n", run.avg_busbw);
    std::printf("#\n");
  }
  if (opt_.memory_report) memory_report();
  if (const std::string made = b_.calls_made(); rank_ == 0 && !made.empty())
    std::printf("# Calls made (this rank, up to here): %s\n", made.c_str());
  if (rank_ == 0) {
    for (const auto& [path, write] : {std::pair{opt_.json_path, 0}, std::pair{opt_.csv_path, 1}}) {
      if (path.empty()) continue;
      const std::string err = write == 0 ? write_json(path, run, opt_) : write_csv(path, run);
      if (!err.empty()) {
        std::fprintf(stderr, "# %s: %s\n", prog_, err.c_str());
        return 1;
      }
    }
  }
  // Rank 0 has printed everything before any rank leaves: a launcher stops the job when the
  // first rank exits with the failure status of a failed check.
  if (!b_.barrier()) return fail("barrier");
  release_buffers();
  if (opt_.hold_s > 0) std::this_thread::sleep_for(std::chrono::seconds(opt_.hold_s));
  if (!b_.finish()) {
    std::fprintf(stderr, "# %s: rank %d: finishing failed: %s\n", prog_, rank_, b_.error().c_str());
    return 1;
  }
  return run.out_of_bounds != 0 ? 1 : 0;
}

}  // namespace

int run_bench(int argc, char** argv, const char* prog, Backend& backend) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // every line visible as it is printed, as nccl-tests does
  Options opt;
  if (int code = parse_options(argc, argv, prog, &opt); code >= 0) {
    if (opt.show_version) {
      const std::string v = backend.version();
      std::printf("%s (%s%s%s)\n", prog, backend.library().c_str(), v.empty() ? "" : " ", v.c_str());
    }
    return code;
  }
  if (std::string err = backend.init(opt); !err.empty()) {
    std::fprintf(stderr, "# %s: %s\n", prog, err.c_str());
    return 1;
  }
  Engine engine(opt, prog, backend);
  return engine.run();
}

}  // namespace bench

// copy-bandwidth: the memory limit an intra-node all-reduce is measured against (issue 3):
// B = the read+write bandwidth one core gets from memcpy while the other cores copy too.
// Each of N processes (pinned to the i-th allowed CPU, as comm-run pins ranks) copies a
// touched buffer into another for a while; B counts bytes read plus bytes written.
//   copy-bandwidth [-n PROCS (2)] [-s BYTES (64M)] [-t SECONDS (2)]
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int nth_cpu(int i) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
  const int count = CPU_COUNT(&set);
  for (int c = 0, k = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set) && k++ == i % count) return c;
  return -1;
}

size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
  return static_cast<size_t>(v);
}

}  // namespace

int main(int argc, char** argv) {
  int procs = 2;
  size_t bytes = size_t{64} << 20;
  double seconds = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "-n")) procs = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-s")) bytes = parse_size(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-t")) seconds = std::atof(argv[i + 1]);
  }
  if (procs < 1 || bytes < 4096 || seconds <= 0) {
    std::fprintf(stderr, "usage: copy-bandwidth [-n PROCS] [-s BYTES] [-t SECONDS]\n");
    return 2;
  }
  auto* results = static_cast<double*>(
      mmap(nullptr, sizeof(double) * static_cast<size_t>(procs), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  auto* ready = static_cast<volatile int*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (results == MAP_FAILED || ready == MAP_FAILED) return 1;
  std::vector<pid_t> kids;
  for (int p = 0; p < procs; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      const int cpu = nth_cpu(p);
      if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        sched_setaffinity(0, sizeof set, &set);
      }
      auto* src = static_cast<char*>(std::aligned_alloc(4096, bytes));
      auto* dst = static_cast<char*>(std::aligned_alloc(4096, bytes));
      std::memset(src, 1, bytes);  // touched before timing
      std::memset(dst, 2, bytes);
      __atomic_add_fetch(ready, 1, __ATOMIC_SEQ_CST);
      while (__atomic_load_n(ready, __ATOMIC_SEQ_CST) < procs) {
      }
      size_t copies = 0;
      const double t0 = now();
      double t = t0;
      while (t - t0 < seconds) {
        std::memcpy(dst, src, bytes);
        asm volatile("" : : "r"(dst) : "memory");  // the copy is the point: keep it
        ++copies;
        t = now();
      }
      results[p] = 2.0 * static_cast<double>(bytes) * static_cast<double>(copies) / (t - t0) / 1e9;
      _exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t k : kids) waitpid(k, nullptr, 0);
  double sum = 0, low = results[0];
  std::printf("# copy-bandwidth: %d processes copying %zu bytes at once, %.1f s\n", procs, bytes, seconds);
  for (int p = 0; p < procs; ++p) {
    std::printf("# process %d (cpu %d): read+write %.2f GB/s\n", p, nth_cpu(p), results[p]);
    sum += results[p];
    if (results[p] < low) low = results[p];
  }
  std::printf("B %.3f GB/s (mean per core; min %.3f, sum %.3f)\n", sum / procs, low, sum);
  return 0;
}

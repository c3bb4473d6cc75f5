#include "params.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "log.h"

namespace comm::params {

const std::vector<Param>& all() {
  static const std::string connect_timeout_default = std::to_string(kSocketConnectTimeoutDefaultMs);
  static const std::vector<Param> table = {
      // libcomm's own
      {"COMM_DEBUG", Type::kEnum, "WARN",
       "log level: each shows the ones before it; VERSION adds libcomm's version line, INFO one line per rank at "
       "init (version, commit, transports, the COMM_*/NCCL_* variables set) and more",
       "NONE,WARN,VERSION,INFO,TRACE"},
      {"COMM_DEBUG_SUBSYS", Type::kString, "ALL",
       "comma list of INIT,NET,COLL,STORE,ENV,ALG,ALL filtering INFO and TRACE lines (warnings always show); a "
       "leading ^ excludes",
       nullptr},
      {"COMM_DEBUG_FILE", Type::kString, "",
       "write log lines to this file instead of stderr (NCCL_DEBUG_FILE's syntax): %h the host name, %p the pid, "
       "%r the rank",
       nullptr},
      {"COMM_TIMEOUT_MS", Type::kInt, "600000",
       "a wait that sees no progress from its peer for this long fails (PyTorch's NCCL default)", nullptr, 1, INT32_MAX},
      {"COMM_HEARTBEAT_MS", Type::kInt, "1000",
       "idle detection: how often a communicator with no call running reads its peers' reports and closes, and "
       "tells its socket peers it lives; a peer silent for COMM_TIMEOUT_MS or gone without comm_destroy breaks it "
       "(comm_get_async_error); 0: off",
       nullptr, 0, 3600 * 1000},
      {"COMM_CHECK_COLLECTIVES", Type::kInt, "0",
       "strict mode, for debugging: every collective confirms with every rank that all called the same collective, "
       "dtype, count, op and root before it returns (one small all-reduce more per call); 1: on",
       nullptr, 0, 1},
      {"COMM_METRICS_ADDR", Type::kString, "",
       "serve Prometheus metrics on http://HOST:PORT/metrics (local rank L on PORT + L; port 0: any free one; "
       "HOST defaults to 127.0.0.1) through the metrics plugin libcomm_metrics.so; unset: nothing listens",
       nullptr},
      {"COMM_METRICS_FILE", Type::kString, "",
       "with COMM_METRICS_ADDR: write where this rank's metrics are, in Prometheus's file_sd format; %h host, "
       "%p pid, %r rank",
       nullptr},
      {"COMM_METRICS_TEXTFILE", Type::kString, "",
       "write the final metrics once, when the process's last communicator is destroyed, in node exporter's "
       "textfile format; %h host, %p pid, %r rank",
       nullptr},
      {"COMM_METRICS_PLUGIN", Type::kString, "",
       "the metrics plugin's file (default: libcomm_metrics.so beside libcomm.so, then the loader's path)",
       nullptr},
      {"COMM_FLIGHT_RECORDER_FILE", Type::kString, "",
       "write each communicator's flight recorder (its last 256 operations, JSON) here when it times out, fails "
       "or is aborted; %h host, %p pid, %r rank; tools/comm-trace merges the ranks' files",
       nullptr},
      {"COMM_STRAGGLER_MS", Type::kInt, "10",
       "straggler detection: a peer whose first message of a collective comes last, this many ms or more after "
       "this rank started it, in half of 100 collectives is named at INFO and counted in the metrics; 0: off",
       nullptr, 0, 3600 * 1000},
      {"COMM_TRANSPORT", Type::kEnum, "auto",
       "host transport between ranks: auto = the topology plan's per peer (shared memory on one host; between "
       "hosts UCX where InfiniBand/RoCE is up, else sockets); shm = shared memory only (every rank on one host); "
       "socket = TCP everywhere; ucx = UCX everywhere (UCX_TLS picks its wires). "
       "Device buffers (a stream): auto = NCCL when every rank has it, else staged through pinned host memory; "
       "nccl = NCCL required (comm_init fails with COMM_ERR_UNAVAILABLE saying why); shm/socket/ucx = staged",
       "auto,nccl,socket,shm,ucx"},
      {"COMM_NCCL_LIBRARY", Type::kString, "", "NCCL library to dlopen instead of libnccl.so.2", nullptr},
      {"COMM_CUDA_LIBRARY", Type::kString, "",
       "CUDA runtime to dlopen instead of libcudart.so.13, .12, .11.0 (the first found)", nullptr},
      {"COMM_UCX_LIBRARY", Type::kString, "",
       "UCX's libucp to dlopen instead of libucp.so.0 (a path that does not load switches UCX off: sockets between "
       "hosts)",
       nullptr},
      {"COMM_IBVERBS_LIBRARY", Type::kString, "",
       "libibverbs to dlopen for the RDMA probe instead of libibverbs.so.1 (one that does not load: no RDMA ports)",
       nullptr},
      {"COMM_AUTH_TOKEN", Type::kString, "", "peers without the same token are refused at rendezvous (proven by challenge-response, never sent)",
       nullptr},
      {"COMM_TLS", Type::kInt, "0",
       "1: the store's and the socket transport's connections run TLS 1.3 (OpenSSL; kernel TLS where the kernel has "
       "it), authenticated by a key derived from COMM_AUTH_TOKEN, or by COMM_TLS_CERT/KEY/CA; every rank alike",
       nullptr, 0, 1},
      {"COMM_TLS_CERT", Type::kString, "", "with COMM_TLS=1: this process's certificate chain (PEM) instead of the PSK",
       nullptr},
      {"COMM_TLS_KEY", Type::kString, "", "with COMM_TLS_CERT: its private key (PEM)", nullptr},
      {"COMM_TLS_CA", Type::kString, "", "with COMM_TLS_CERT: the CA (PEM) every peer's certificate must be signed by",
       nullptr},
      {"COMM_TLS_CIPHER", Type::kEnum, "auto",
       "AES-128-GCM of libcomm's own TLS records (where the kernel has no TLS): auto = Intel's ipsec-mb where it has a "
       "VAES path for this CPU (AVX-512), OpenSSL's EVP elsewhere and always in FIPS mode; ipsec-mb = ipsec-mb wherever "
       "it loads; openssl = OpenSSL's EVP always. Read once per process",
       "auto,ipsec-mb,openssl"},
      {"COMM_TLS_AES", Type::kEnum, "auto",
       "the older name of COMM_TLS_CIPHER: openssl forces OpenSSL's EVP where COMM_TLS_CIPHER is auto",
       "auto,openssl"},
      {"COMM_TUNING_FILE", Type::kString, "", "tuning profile (JSON) written by comm-tune", nullptr},
      {"COMM_SOCKET_IFNAME", Type::kString, "",
       "interfaces for data and rendezvous (NCCL_SOCKET_IFNAME syntax); falls back to NCCL_SOCKET_IFNAME",
       nullptr},
      {"COMM_SOCKET_NCONNS", Type::kInt, "2", "TCP connections per peer; large messages are striped", nullptr, 1, 8},
      {"COMM_SOCKET_EAGER", Type::kInt, "0",
       "1: the socket transport connects every pair of ranks at init (a full mesh, connection errors at init); "
       "0: a peer is connected when an operation first needs it", nullptr, 0, 1},
      {"COMM_SOCKET_CONNECT_TIMEOUT_MS", Type::kInt, connect_timeout_default.c_str(),
       "how long a TCP handshake to one of a peer's addresses may go unanswered before the next address is "
       "the only hope (a firewall that drops packets); bounds the handshake only, never a busy peer's reply",
       nullptr, 100, 600000},
      {"COMM_JOIN", Type::kInt, "0",
       "1: this process joins a running job: its comm_init waits for the job's next comm_grow and returns the "
       "grown communicator (its rank and world size are ignored)",
       nullptr, 0, 1},
      {"COMM_STORE_EXTERNAL", Type::kInt, "0",
       "1: the env:// store at MASTER_ADDR:MASTER_PORT is served outside the ranks (comm-run --replace-failed); "
       "rank 0 connects as a client, and the store outlives it (joiners can find the job)",
       nullptr, 0, 1},
      {"COMM_HOST_ID", Type::kString, "", "ranks with the same value are on the same host", nullptr},
      {"COMM_ALGO", Type::kString, "",
       "force an algorithm, e.g. ring or recursive_doubling (falls back when it cannot run)", nullptr},
      {"COMM_CHUNK_BYTES", Type::kInt, "524288", "pipelining chunk of the ring algorithms", nullptr, 4096, int64_t{1} << 30},
      {"COMM_RING_DEPTH", Type::kInt, "2",
       "ring algorithms: chunks in flight each way (receives posted ahead of the one being reduced, sends not yet "
       "retired)", nullptr, 2, 4},
      {"COMM_RING_SENDS", Type::kInt, "8",
       "ring algorithms: sends in flight to the next rank, each posted once its data is final (more data queued in "
       "the kernel while the rank waits for a CPU or a peer)", nullptr, 1, 16},
      {"COMM_SMALL_MSG_BYTES", Type::kInt, "65536",
       "all-reduce up to this size uses the latency algorithm (recursive doubling)", nullptr, 0, INT64_MAX},
      // the gradient engine (libcomm/src/engine/)
      {"COMM_ENGINE_BUCKET_CAP_BYTES", Type::kInt, "26214400",
       "gradient engine: bucket size limit (bytes) when comm_engine_config_t.bucket_cap_bytes is unset", nullptr, 1, int64_t{1} << 40},
      {"COMM_ENGINE_FIRST_BUCKET_BYTES", Type::kInt, "1048576",
       "gradient engine: limit of the first bucket when comm_engine_config_t.first_bucket_bytes is unset", nullptr, 1, int64_t{1} << 40},
      {"COMM_ENGINE_PARTITION_BYTES", Type::kInt, "4194304",
       "gradient engine: buckets go on the wire in partitions of up to this many bytes, highest priority first, "
       "when comm_engine_config_t.partition_bytes is unset",
       nullptr, 1, INT64_MAX},
      {"COMM_ENGINE_OVERLAP_FORWARD", Type::kInt, "0",
       "gradient engine: 1 = comm_engine_end returns once every gradient is reported; comm_engine_wait(i) before "
       "gradient i is read (when comm_engine_config_t.overlap_forward is unset)",
       nullptr, 0, 1},
      {"COMM_ENGINE_SCHEDULE", Type::kString, "priority",
       "gradient engine: priority (partitions ready on every rank, highest priority first) or fifo (bucket order, "
       "as torch's DDP; for comparison)",
       nullptr},
      {"COMM_TRACE_FILE", Type::kString, "",
       "gradient engine: write a Chrome/Perfetto trace (JSON) of steps and buckets here at comm_engine_destroy; "
       "%r becomes the rank",
       nullptr},
      // topology probe and path policy (topology/)
      {"COMM_TOPO_XML", Type::kString, "",
       "read GPUs, NICs and PCI placement from this file (hwloc XML or NCCL topology XML) instead of hwloc", nullptr},
      {"COMM_CROSS_ZONE", Type::kInt, "0",
       "1: ranks span zones or long-haul links, so NCCL_IB_TIMEOUT defaults to 23 instead of 20", nullptr, 0, 1},
      {"COMM_LONG_HAUL_RTT_US", Type::kInt, "1000",
       "a round trip to the rendezvous store over this (us) counts as long-haul (NCCL_IB_TIMEOUT 23 on that rank)",
       nullptr, 1, 60000000},
      {"COMM_SHM_SLOT_BYTES", Type::kInt, "16384",
       "shared memory: all-reduce up to this size goes through one shared slot per rank (shm_slots); larger "
       "ones read peers' buffers directly (shm_direct). Every local rank must use the same value",
       nullptr, 64, 16 << 20},
      {"COMM_SHM_CHUNK_BYTES", Type::kInt, "131072",
       "shared memory: pipelining chunk (per rank's slice) of the direct all-reduce; its staging rings hold "
       "4 chunks per local rank. Every local rank must use the same value",
       nullptr, 4096, int64_t{1} << 30},
      {"COMM_SHM_STREAM_BYTES", Type::kInt, "-1",
       "shared memory: an out-of-place all-reduce of at least this many bytes writes its result into an ordinary "
       "(not comm_mem_alloc) output buffer with streaming stores, which skip reading the destination first "
       "(-1: half the L3 cache; 0: always)",
       nullptr, -1, int64_t{1} << 50},
      {"COMM_SHM_CMA", Type::kInt, "1",
       "shared memory: 1 = large point-to-point messages are read from the sender's buffer with "
       "process_vm_readv (one copy) when the kernel allows it; 0 = copied through the channel",
       nullptr, 0, 1},
      {"COMM_SHM_ARENA_BYTES", Type::kInt, "68719476736",
       "shared memory: address space each rank reserves (not allocates) for comm_mem_alloc buffers and staging",
       nullptr, int64_t{1} << 30, int64_t{1} << 46},
      {"COMM_SOCKET_PROGRESS_THREAD_BYTES", Type::kInt, "0",
       "sockets: a request of at least this many bytes starts the transport's progress thread, which moves "
       "open requests' bytes while no caller is inside the transport (0: no thread; waits move everything)",
       nullptr, 0, INT64_MAX},
      {"COMM_SOCKET_SPIN_US", Type::kInt, "0",
       "sockets: microseconds a wait polls without blocking after each progress, before it sleeps in poll() "
       "(0: never spin; spinning trades a trainer's CPU for wake-up latency)",
       nullptr, 0, 1000000},
      {"COMM_SHM_SPIN_US", Type::kInt, "-1",
       "shared memory: microseconds a wait spins before it yields or sleeps on a futex (-1: 200 when local "
       "ranks <= cores; else 0, then sched_yield for up to 1 ms)",
       nullptr, -1, 1000000},
      // tools and tests, not the library (here so that setting them is not warned about)
      {"COMM_BENCH_CORRUPT", Type::kString, "",
       "comm-bench, tests only: RANK:INDEX flips one byte of that output element on that rank after each check",
       nullptr},
      {"COMM_TEST_INIT_TREE", Type::kString, "",
       "tests only, a hook in comm_init: corrupt:RANK, stall:RANK or exit:RANK makes that rank's answer to its "
       "children in the init verdict's tree wrong, or never come, or the rank exit after joining "
       "(tests/core/test_init_tree.sh)",
       nullptr},
      {"COMM_TEST_JOIN_EXIT", Type::kString, "",
       "tests only, a hook in a joiner's comm_init (COMM_JOIN=1): answered makes it exit (status 9) as soon as "
       "a comm_grow answered it, counted into its slot; registered, as soon as it wrote its hello "
       "(tests/tools/test_comm_run_replace.sh)",
       nullptr},
      {"COMM_TEST_WIRE", Type::kString, "", "unit tests: run the algorithm sweeps over this transport (e.g. ucx)",
       nullptr},
      {"COMM_FIXTURES_DIR", Type::kString, "", "topology tests: where the machine exports are (tests/fixtures)",
       nullptr},
      {"COMM_PRINT_SELECTION", Type::kString, "", "algorithm selection test: print the selection table", nullptr},
      {"COMM_ASAN_TESTS", Type::kString, "~[slow]", "scripts/test.sh: Catch2 test spec of the ASan+UBSan tier",
       nullptr},
      // launchers
      {"MASTER_ADDR", Type::kString, "", "torchrun: rank 0's address (the store)", nullptr},
      {"MASTER_PORT", Type::kString, "", "torchrun: the store's port", nullptr},
      {"RANK", Type::kString, "", "torchrun: this rank", nullptr},
      {"WORLD_SIZE", Type::kString, "", "torchrun: number of ranks", nullptr},
      {"LOCAL_RANK", Type::kString, "", "torchrun: rank on this host", nullptr},
      {"LOCAL_WORLD_SIZE", Type::kString, "", "torchrun: ranks on this host", nullptr},
      {"TORCHELASTIC_RUN_ID", Type::kString, "", "torchrun: job id (default port)", nullptr},
      {"TORCHELASTIC_USE_AGENT_STORE", Type::kString, "",
       "torchrun: True when its agent serves MASTER_ADDR:MASTER_PORT with c10d's store (static rendezvous), "
       "which libcomm cannot use: env:// fails at once, naming --standalone / --rdzv_backend c10d", nullptr},
      {"OMPI_COMM_WORLD_RANK", Type::kString, "", "Open MPI: this rank", nullptr},
      {"OMPI_COMM_WORLD_SIZE", Type::kString, "", "Open MPI: number of ranks", nullptr},
      {"OMPI_COMM_WORLD_LOCAL_RANK", Type::kString, "", "Open MPI: rank on this host", nullptr},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", Type::kString, "", "Open MPI: ranks on this host", nullptr},
      {"OMPI_MCA_ess_base_jobid", Type::kString, "", "Open MPI: job id (default port)", nullptr},
      {"SLURM_PROCID", Type::kString, "", "Slurm: this rank", nullptr},
      {"SLURM_NTASKS", Type::kString, "", "Slurm: number of ranks", nullptr},
      {"SLURM_LOCALID", Type::kString, "", "Slurm: rank on this host", nullptr},
      {"SLURM_NNODES", Type::kString, "", "Slurm: number of hosts", nullptr},
      {"SLURM_JOB_ID", Type::kString, "", "Slurm: job id (default port)", nullptr},
      {"SLURM_STEP_ID", Type::kString, "", "Slurm: job step (with SLURM_JOB_ID, the default port)", nullptr},
      // NCCL's, honoured with NCCL's semantics
      {"NCCL_SOCKET_IFNAME", Type::kString, "", "NCCL's interface selection (used when COMM_SOCKET_IFNAME is unset)",
       nullptr},
      {"NCCL_IB_TIMEOUT", Type::kString, "", "NCCL: IB timeout, 4.096us x 2^n", nullptr},
      {"NCCL_IB_HCA", Type::kString, "", "NCCL: IB HCAs to use", nullptr},
      {"NCCL_IB_RETRY_CNT", Type::kString, "", "NCCL: IB retry count (0-7); the plan sets 7 with NCCL_IB_TIMEOUT",
       nullptr},
      {"NCCL_TOPO_FILE", Type::kString, "",
       "NCCL: topology XML; libcomm reads GPU/HCA placement from it too when COMM_TOPO_XML is unset", nullptr},
      {"NCCL_DEBUG", Type::kString, "", "NCCL: log level", nullptr},
  };
  return table;
}

const Param* find(const char* name) {
  for (const auto& p : all())
    if (std::strcmp(p.name, name) == 0) return &p;
  return nullptr;
}

namespace {

Status parse_int(const char* name, const std::string& text, int64_t min, int64_t max, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || end == text.c_str() || *end != '\0')
    return InvalidArgument(std::string(name) + "='" + text + "' is not an integer; set it to a whole number");
  if (v < min || v > max)
    return InvalidArgument(std::string(name) + "=" + text + " is out of range [" + std::to_string(min) + ", " +
                           std::to_string(max) + "]");
  *out = v;
  return Status::Ok();
}

}  // namespace

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

Status get_int(const char* name, int64_t* out) {
  const Param* p = find(name);
  if (p == nullptr || p->type != Type::kInt)
    return Internal(std::string("parameter ") + name + " is not an integer in the registry");
  auto v = env(name);
  return parse_int(name, v ? *v : p->fallback, p->min, p->max, out);
}

int64_t int_or_default(const char* name, uint32_t subsys) {
  int64_t v = 0;
  Status st = get_int(name, &v);
  if (st.ok()) return v;
  const Param* p = find(name);
  const char* fallback = p != nullptr ? p->fallback : "0";
  log::write(log::Level::kWarn, subsys, "%s; using the default, %s", st.message().c_str(),
             fallback);
  return std::strtoll(fallback, nullptr, 10);
}

Status socket_connect_timeout_ms(int* out) {
  int64_t v = kSocketConnectTimeoutDefaultMs;
  const Status st = get_int("COMM_SOCKET_CONNECT_TIMEOUT_MS", &v);  // the row's range fits an int
  *out = st.ok() ? static_cast<int>(v) : kSocketConnectTimeoutDefaultMs;
  return st;
}

Status get_string(const char* name, std::string* out) {
  const Param* p = find(name);
  if (p == nullptr) return Internal(std::string("parameter ") + name + " is not in the registry");
  auto v = env(name);
  *out = v ? *v : p->fallback;
  if (p->type == Type::kEnum && p->choices != nullptr) {
    std::string choices = std::string(",") + p->choices + ",";
    std::string lowered = *out, upper = *out;
    for (auto& c : lowered) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
    for (auto& c : upper) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
    if (choices.find("," + lowered + ",") == std::string::npos &&
        choices.find("," + upper + ",") == std::string::npos)
      return InvalidArgument(std::string(name) + "='" + *out + "' is not one of " + p->choices);
  }
  return Status::Ok();
}

Status get_optional_int(const char* name, int64_t min, int64_t max, int64_t* out, bool* present) {
  auto v = env(name);
  *present = v.has_value();
  if (!v) return Status::Ok();
  return parse_int(name, *v, min, max, out);
}

namespace {

bool secret(const std::string& name) {
  for (const char* word : {"TOKEN", "SECRET", "PASSWORD"})
    if (name.find(word) != std::string::npos) return true;
  return false;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::string> set_variables() {
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (entry.rfind("COMM_", 0) != 0 && entry.rfind("NCCL_", 0) != 0) continue;
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    out.push_back(secret(entry.substr(0, eq)) ? entry.substr(0, eq) + "=(set)" : entry);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string nearest_name(const std::string& name) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const auto& p : all()) {
    const size_t d = edit_distance(name, p.name);
    if (d < best_distance) {
      best_distance = d;
      best = p.name;
    }
  }
  return best;
}

std::vector<std::string> unknown_variables() {
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (entry.rfind("COMM_", 0) != 0 || eq == std::string::npos) continue;
    const std::string name = entry.substr(0, eq);
    if (find(name.c_str()) != nullptr) continue;
    out.push_back(name + " is set but libcomm has no such variable, so it has no effect; did you mean " +
                  nearest_name(name) + "? (comm-run --params lists them all)");
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string describe_all() {
  std::string text;
  for (const auto& p : all()) {
    auto v = env(p.name);
    text += p.name;
    text += "=";
    text += v ? *v : std::string(p.fallback);
    text += v ? "  (set)" : "  (default)";
    text += "\n    ";
    text += p.doc;
    if (p.choices) text += std::string(" [") + p.choices + "]";
    if (p.type == Type::kInt) text += " [" + std::to_string(p.min) + ".." + std::to_string(p.max) + "]";
    text += "\n";
  }
  return text;
}

}  // namespace comm::params

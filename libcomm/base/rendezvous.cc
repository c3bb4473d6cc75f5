// Who am I and where do we meet. Precedence: comm_config_t fields, then the launcher's
// environment (torchrun, else Open MPI, else Slurm), then "a single process, no launcher".
#include "rendezvous.h"

#include <climits>
#include <cstdint>

#include "hash.h"
#include "log.h"
#include "params.h"

namespace comm {
namespace {

constexpr int kDefaultMasterPort = 29500;  // torchrun's
constexpr int kDerivedPortBase = 20000;
constexpr int kDerivedPortSpan = 40000;  // derived ports fall in 20000..59999

enum class Kind { kEnv, kTcp, kFile, kMemory };

struct Launcher {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  // nullptr: the launcher does not say (Slurm: see SLURM_NNODES)
  const char* job_id;
};

constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "SLURM_JOB_ID"},
};

const Launcher* detect_launcher() {
  for (const auto& l : kLaunchers)
    if (params::env(l.rank) || params::env(l.size)) return &l;
  return nullptr;
}

// An integer variable of the launcher's; the error names it, its value and what it means.
Status read_int(const char* name, int64_t min, const char* meaning, int* out, bool* present) {
  int64_t value = 0;
  Status st = params::get_optional_int(name, min, INT_MAX, &value, present);
  if (!st.ok()) return InvalidArgument(st.message() + " (" + name + ": " + meaning + ")");
  if (*present) *out = static_cast<int>(value);
  return Status::Ok();
}

Status parse_port(const std::string& text, const std::string& what, int* port) {
  bool digits = !text.empty() && text.size() <= 5;
  for (char c : text) digits = digits && c >= '0' && c <= '9';
  int value = digits ? std::stoi(text) : 0;
  if (value < 1 || value > 65535)
    return InvalidArgument(what + ": port '" + text + "' is not a number in 1..65535");
  *port = value;
  return Status::Ok();
}

std::string tcp_url(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "tcp://[" + host + "]:" + std::to_string(port);
  return "tcp://" + host + ":" + std::to_string(port);
}

Status parse_init_method(const std::string& method, Kind* kind, Identity* id) {
  auto unsupported = [&](const std::string& why) {
    return InvalidArgument("init_method '" + method + "' " + why +
                           "; supported: env:// (default), tcp://HOST:PORT (IPv6: tcp://[ADDR]:PORT), "
                           "file:///ABSOLUTE/PATH, memory://NAME (ranks as threads of one process)");
  };
  if (method == "env://") {
    *kind = Kind::kEnv;
    id->init_method = "env://";
    return Status::Ok();
  }
  if (method.rfind("tcp://", 0) == 0) {
    std::string rest = method.substr(6);
    std::string host, port_text;
    if (!rest.empty() && rest[0] == '[') {
      size_t close = rest.find(']');
      if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
        return unsupported("has an unterminated IPv6 address or no port");
      host = rest.substr(1, close - 1);
      port_text = rest.substr(close + 2);
    } else {
      size_t colon = rest.rfind(':');
      if (colon == std::string::npos) return unsupported("has no port");
      host = rest.substr(0, colon);
      port_text = rest.substr(colon + 1);
      if (host.find(':') != std::string::npos) return unsupported("has an IPv6 address without brackets");
    }
    if (host.empty()) return unsupported("has no host");
    *kind = Kind::kTcp;
    COMM_RETURN_IF_ERROR(parse_port(port_text, "init_method '" + method + "'", &id->store_port));
    id->store_host = host;
    id->init_method = tcp_url(host, id->store_port);
    return Status::Ok();
  }
  if (method.rfind("file://", 0) == 0) {
    std::string path = method.substr(7);
    if (path.empty() || path[0] != '/') return unsupported("needs an absolute path (three slashes: file:///PATH)");
    *kind = Kind::kFile;
    id->path = path;
    id->init_method = method;
    return Status::Ok();
  }
  if (method.rfind("memory://", 0) == 0) {
    if (method.size() == 9) return unsupported("has no store name");
    *kind = Kind::kMemory;
    id->path = method.substr(9);
    id->init_method = method;
    return Status::Ok();
  }
  return unsupported("has an unknown scheme");
}

// FNV-1a: the same job id gives the same port on every rank and every build.
int derived_port(const std::string& job_id) {
  const uint64_t h = fnv1a(job_id);
  return kDerivedPortBase + static_cast<int>(h % kDerivedPortSpan);
}

// Rank, world size, local layout and job id.
Status resolve_ranks(const comm_config_t& cfg, Kind kind, Identity* id) {
  if (cfg.rank != COMM_UNSET && cfg.rank < 0)
    return InvalidArgument("comm_config_t.rank=" + std::to_string(cfg.rank) +
                           " is negative; set 0..world_size-1, or COMM_UNSET to take it from the launcher");
  if (cfg.world_size != COMM_UNSET && cfg.world_size < 1)
    return InvalidArgument("comm_config_t.world_size=" + std::to_string(cfg.world_size) +
                           " must be at least 1, or COMM_UNSET to take it from the launcher");
  int rank = cfg.rank, size = cfg.world_size;
  std::string rank_name = "comm_config_t.rank", size_name = "comm_config_t.world_size";
  const Launcher* launcher = detect_launcher();
  if (launcher != nullptr) {
    bool present = false;
    int env_size = -1;
    Status size_read = read_int(launcher->size, 1, "the number of ranks, at least 1", &env_size, &present);
    if (size != COMM_UNSET && !size_read.ok()) env_size = -1;  // the configured size wins; ignore the variable
    else COMM_RETURN_IF_ERROR(size_read);
    if (size == COMM_UNSET) {
      if (!present)
        return InvalidArgument(std::string(launcher->rank) + " is set but " + launcher->size + " is not (" +
                               launcher->name + " sets both); set " + launcher->size +
                               " or comm_config_t.world_size");
      size = env_size;
      size_name = launcher->size;
    }
    if (rank == COMM_UNSET) {
      COMM_RETURN_IF_ERROR(read_int(launcher->rank, 0, "this process's rank, 0..world size-1", &rank, &present));
      if (!present)
        return InvalidArgument(std::string(launcher->size) + " is set but " + launcher->rank + " is not (" +
                               launcher->name + " sets both); set " + launcher->rank + " or comm_config_t.rank");
      rank_name = launcher->rank;
    }
    // The launcher's layout describes this job only if its world is ours.
    if (env_size == size) {
      COMM_RETURN_IF_ERROR(read_int(launcher->local_rank, 0, "this process's rank on its host", &id->local_rank,
                                    &present));
      if (launcher->local_size != nullptr) {
        COMM_RETURN_IF_ERROR(read_int(launcher->local_size, 1, "the number of ranks on this host",
                                      &id->local_world_size, &present));
      } else {
        int nodes = -1;
        COMM_RETURN_IF_ERROR(read_int("SLURM_NNODES", 1, "the number of hosts", &nodes, &present));
        if (nodes == 1) id->local_world_size = size;
      }
    }
    if (auto job = params::env(launcher->job_id)) id->job_id = *job;
    // Job steps of one Slurm allocation run side by side: each step needs its own port.
    if (launcher->local_size == nullptr && !id->job_id.empty())
      if (auto step = params::env("SLURM_STEP_ID")) id->job_id += "." + *step;
  } else if (rank == COMM_UNSET && size == COMM_UNSET) {
    // No launcher and nothing configured: a single process is a one-rank job.
    rank = 0;
    size = 1;
    COMM_INFO(kEnv, "no launcher environment (RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_*) and no rank in "
                    "comm_config_t: running as a single rank");
  } else if (rank == COMM_UNSET) {
    return InvalidArgument(size_name + "=" + std::to_string(size) +
                           " is set but this process's rank is not: set comm_config_t.rank, or RANK in the "
                           "environment (torchrun sets it)");
  } else if (size == COMM_UNSET) {
    return InvalidArgument(rank_name + "=" + std::to_string(rank) +
                           " is set but the world size is not: set comm_config_t.world_size, or WORLD_SIZE in the "
                           "environment (torchrun sets it)");
  }
  if (rank >= size)
    return InvalidArgument(rank_name + "=" + std::to_string(rank) + " is not below " + size_name + "=" +
                           std::to_string(size) + " (ranks run from 0 to " + std::to_string(size - 1) +
                           "); check the launcher's environment or comm_config_t");
  if (kind == Kind::kMemory || size == 1) {
    // Threads of one process (or a lone process) are on one host.
    id->local_rank = rank;
    id->local_world_size = size;
  }
  if (id->local_world_size > size)
    return InvalidArgument("the launcher says " + std::to_string(id->local_world_size) + " ranks run on this host, " +
                           "more than the world size " + std::to_string(size) + " (" + size_name + ")");
  id->rank = rank;
  id->world_size = size;
  return Status::Ok();
}

// env://: MASTER_ADDR/MASTER_PORT, or 127.0.0.1 and a port from the job id when every rank
// is on this host.
Status resolve_master(Identity* id) {
  bool has_port = false;
  int port = 0;
  COMM_RETURN_IF_ERROR(read_int("MASTER_PORT", 0, "the TCP port of rank 0's store", &port, &has_port));
  if (has_port && (port < 1 || port > 65535))
    return InvalidArgument("MASTER_PORT=" + std::to_string(port) +
                           " is not a TCP port; set it to a free port in 1..65535 on rank 0's host");
  if (auto addr = params::env("MASTER_ADDR")) {
    id->store_host = *addr;
    id->store_port = has_port ? port : kDefaultMasterPort;
    return Status::Ok();
  }
  bool one_host = id->world_size == 1 || id->local_world_size == id->world_size;
  if (!one_host) {
    std::string layout = id->local_world_size > 0
                             ? std::to_string(id->local_world_size) + " of them on this host"
                             : "the launcher does not say how many run on each host";
    return InvalidArgument("MASTER_ADDR is not set, and the " + std::to_string(id->world_size) +
                           " ranks may span several hosts (" + layout +
                           "): MASTER_ADDR/MASTER_PORT are needed across hosts; set MASTER_ADDR to rank 0's "
                           "host name or address and MASTER_PORT to a free port there, or use init_method "
                           "tcp://HOST:PORT");
  }
  id->store_host = "127.0.0.1";
  if (has_port)
    id->store_port = port;
  else if (id->world_size == 1)
    id->store_port = 0;  // nobody else connects: any free port
  else if (!id->job_id.empty())
    id->store_port = derived_port(id->job_id);
  else
    id->store_port = kDefaultMasterPort;
  COMM_INFO(kEnv, "MASTER_ADDR is not set and all %d ranks are on this host: store at 127.0.0.1:%d%s",
            id->world_size, id->store_port, !has_port && !id->job_id.empty() ? " (port from the job id)" : "");
  return Status::Ok();
}

}  // namespace

Status resolve_identity(const comm_config_t& cfg, Identity* out) {
  if (out == nullptr) return InvalidArgument("resolve_identity: out is NULL");
  Identity id;
  std::string method = cfg.init_method != nullptr ? cfg.init_method : "env://";
  Kind kind = Kind::kEnv;
  COMM_RETURN_IF_ERROR(parse_init_method(method, &kind, &id));
  COMM_RETURN_IF_ERROR(resolve_ranks(cfg, kind, &id));
  if (kind == Kind::kEnv) COMM_RETURN_IF_ERROR(resolve_master(&id));
  int64_t external = 0, join = 0;
  COMM_RETURN_IF_ERROR(params::get_int("COMM_STORE_EXTERNAL", &external));
  COMM_RETURN_IF_ERROR(params::get_int("COMM_JOIN", &join));
  const auto agent = params::env("TORCHELASTIC_USE_AGENT_STORE");
  id.external_store = external != 0 || (agent && (*agent == "True" || *agent == "true" || *agent == "1"));
  id.join = join != 0;
  *out = std::move(id);
  return Status::Ok();
}

Status open_store(const Identity& id, int timeout_ms, const std::string& auth_token, std::shared_ptr<Store>* out,
                  std::shared_ptr<tls::Context> tls) {
  if (out == nullptr) return InvalidArgument("open_store: out is NULL");
  if (timeout_ms <= 0) return InvalidArgument("rendezvous timeout " + std::to_string(timeout_ms) + " ms must be positive");
  const std::string& m = id.init_method;
  if (m.rfind("memory://", 0) == 0) {
    *out = memory_store(id.path);
    return Status::Ok();
  }
  std::string context = "rank " + std::to_string(id.rank) + ", rendezvous " + m + ": ";
  if (m.rfind("file://", 0) == 0) return make_file_store(id.path, out).prefixed(context);
  if (m != "env://" && m.rfind("tcp://", 0) != 0)
    return InvalidArgument(context + "not a normalised init_method (resolve_identity makes one)");
  TcpStoreOptions options;
  options.host = id.store_host;
  options.port = id.store_port;
  options.is_server = id.rank == 0 && !id.external_store && !id.join;
  options.external = id.external_store;
  options.world_size = id.world_size;
  options.timeout_ms = timeout_ms;
  options.auth_token = auth_token;
  options.tls = std::move(tls);
  return make_tcp_store(options, out).prefixed(context);
}

}  // namespace comm

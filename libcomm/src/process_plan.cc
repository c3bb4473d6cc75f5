#include "process_plan.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>

#include "log.h"
#include "params.h"
#include "store/store.h"
#include "nccl_env.h"
#include "registry.h"

namespace comm::topology {
namespace {

std::string string_param(const char* name) {
  std::string v;
  if (!params::get_string(name, &v).ok()) return "";
  return v;
}

int numa_of_current_cpu() {
  int cpu = sched_getcpu();
  if (cpu < 0) return -1;
  for (int node = 0; node < 1024; ++node) {
    std::string path = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/node" + std::to_string(node);
    if (access(path.c_str(), F_OK) == 0) return node;
  }
  return -1;
}

struct ProcessState {
  std::once_flag topo_once;
  Topology topo;
  std::once_flag plan_once;
  Plan plan;
  std::optional<double> rtt_us;
};

ProcessState& state() {
  static ProcessState* s = new ProcessState;  // never destroyed: read by threads until exit
  return *s;
}

std::optional<double> measure_rtt_us(Store* store) {
  if (store == nullptr) return std::nullopt;
  double best = -1;
  for (int i = 0; i < 3; ++i) {
    int64_t ignored = 0;
    auto t0 = std::chrono::steady_clock::now();
    if (!store->add("topology/rtt_probe", 0, &ignored).ok()) return std::nullopt;
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (best < 0 || us < best) best = us;
  }
  return best;
}

}  // namespace

Env Env::from_process() {
  Env env;
  env.comm_socket_ifname = string_param("COMM_SOCKET_IFNAME");
  env.nccl_socket_ifname = string_param("NCCL_SOCKET_IFNAME");
  env.nccl_ib_timeout = string_param("NCCL_IB_TIMEOUT");
  env.nccl_ib_retry_cnt = string_param("NCCL_IB_RETRY_CNT");
  env.nccl_ib_hca = string_param("NCCL_IB_HCA");
  env.comm_transport = string_param("COMM_TRANSPORT");
  for (auto& c : env.comm_transport) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  env.cross_zone = params::int_or_default("COMM_CROSS_ZONE", log::kEnv) == 1;
  return env;
}

ProbeOptions probe_options_from_env() {
  ProbeOptions o;
  o.file = string_param("COMM_TOPO_XML");
  if (o.file.empty()) o.file = string_param("NCCL_TOPO_FILE");
  return o;
}

Config config_from_env() {
  Config c;
  for (const char* name : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    int64_t v = 0;
    bool present = false;
    if (params::get_optional_int(name, 0, 1 << 20, &v, &present).ok() && present) {
      c.local_rank = static_cast<int>(v);
      break;
    }
  }
  c.numa = numa_of_current_cpu();
  // What this build implements, from the registry: the plan may pick UCX for IB/RoCE peers.
  for (const auto& t : transport::registry())
    if (t.built() && std::find(c.host_transports.begin(), c.host_transports.end(), t.name) == c.host_transports.end())
      c.host_transports.emplace_back(t.name);
  int64_t threshold = 0;
  if (params::get_int("COMM_LONG_HAUL_RTT_US", &threshold).ok())
    c.long_haul_rtt_us = static_cast<double>(threshold);
  return c;
}

const Topology& topology_for_process() {
  ProcessState& s = state();
  std::call_once(s.topo_once, [&] {
    ProbeOptions options = probe_options_from_env();
    Status st = probe(options, &s.topo);
    if (!st.ok()) {
      COMM_WARN(kInit, "topology: %s; probing this machine instead", st.message().c_str());
      options.file.clear();
      (void)probe(options, &s.topo);
      s.topo.notes.push_back("topology file not used: " + st.message());
    }
  });
  return s.topo;
}

const Plan& plan_for_process() {
  ProcessState& s = state();
  std::call_once(s.plan_once, [&] {
    Config config = config_from_env();
    config.rendezvous_rtt_us = s.rtt_us;
    s.plan = make_plan(topology_for_process(), Env::from_process(), config);
  });
  return s.plan;
}

std::string peer_transport_digest() {
  // Independent of the round trip, so it can be computed before the store is measured.
  return make_plan(topology_for_process(), Env::from_process(), config_from_env()).host_transport_digest();
}

std::string host_transport_for(PeerClass c) { return plan_for_process().peer(c).host_transport; }

void prepare_process(Store* store, const std::vector<NcclSetting>& profile_nccl) {
  static std::once_flag once;
  std::call_once(once, [&] {
    ProcessState& s = state();
    s.rtt_us = measure_rtt_us(store);
    const Topology& topo = topology_for_process();
    const Plan& plan = plan_for_process();
    size_t usable = plan.ib_hcas.size();
    std::string itfs;
    for (const auto& i : plan.interfaces) itfs += (itfs.empty() ? "" : ",") + i.name;
    COMM_INFO(kInit, "topology (%s): %zu GPU(s), %zu RDMA device(s) (%zu for IB), interfaces %s; host transport %s",
              topo.source.c_str(), topo.gpus.size(), topo.hcas.size(), usable, itfs.empty() ? "none" : itfs.c_str(),
              plan.host_transport_digest().c_str());
    for (const auto& d : plan.decisions)
      COMM_TRACE(kInit, "plan: %s -> %s (%s)", d.topic.c_str(), d.choice.c_str(), d.rule.c_str());
    Config config = config_from_env();
    Env env = Env::from_process();
    if (s.rtt_us && *s.rtt_us > config.long_haul_rtt_us && !env.cross_zone && usable > 0)
      COMM_WARN(kEnv,
                "round trip to the rendezvous store is %.0f us (> %.0f us): long-haul links; this rank uses "
                "NCCL_IB_TIMEOUT %d, set COMM_CROSS_ZONE=1 on every rank so that all of them do",
                *s.rtt_us, config.long_haul_rtt_us, plan.ib.timeout);
    if (plan.uses_nccl) (void)apply_nccl_settings_once(profile_nccl);
  });
}

bool apply_nccl_settings_once(const std::vector<NcclSetting>& profile_nccl) {
  static std::once_flag once;
  static std::vector<NcclSetting> applied;  // the profile's, as applied by the first call
  std::call_once(once, [&] {
    applied = profile_nccl;
    (void)apply_nccl_settings(merge_nccl_settings(plan_for_process().nccl, profile_nccl));
  });
  if (applied.size() != profile_nccl.size()) return false;
  for (size_t i = 0; i < applied.size(); ++i)
    if (applied[i].name != profile_nccl[i].name || applied[i].value != profile_nccl[i].value) return false;
  return true;
}

}  // namespace comm::topology

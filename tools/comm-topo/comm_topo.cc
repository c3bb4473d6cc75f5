// comm-topo: what the topology probe found on this machine (or in a topology file), which path
// the policy chose for each class of peer and why, and the NCCL settings a job would get.
//   comm-topo                      this machine, as comm_init would see it
//   comm-topo --topology FILE      hwloc XML or NCCL topology XML, planned offline
//   comm-topo --json               the same as JSON (schema: topology/README.md)
//   comm-topo --explain            every decision with the rule that made it
#include <getopt.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "params.h"
#include "device/device.h"
#include "plan_json.h"
#include "policy.h"
#include "probe.h"
#include "process_plan.h"
#include "version.h"

namespace topo = comm::topology;

namespace {

struct Options {
  bool json = false;
  bool explain = false;
  bool params = false;
  std::string topology;  // a file to plan for, instead of this machine
  int local_rank = -1;   // -1: from LOCAL_RANK
  double rtt_us = -1;    // a rendezvous round trip to plan with; -1: none
};

// The option getopt refused: "-x" for a short one (optopt), else the argument itself (a long one).
std::string bad_option(char** argv) {
  if (optopt != 0) return std::string("-") + static_cast<char>(optopt);
  return argv[optind - 1];
}

void usage(FILE* out) {
  std::fprintf(out,
               "usage: comm-topo [--topology FILE] [--json | --explain] [--local-rank N] [--rtt-us US] [--params]\n"
               "  --topology FILE  plan for a hwloc XML or NCCL topology XML file instead of this machine\n"
               "  --json           machine-readable output (schema libcomm.topology/1, see topology/README.md)\n"
               "  --explain        also print every decision with the rule that made it\n"
               "  --local-rank N   plan as local rank N (its GPU, its nearest interface); default LOCAL_RANK\n"
               "  --rtt-us US      plan with this rendezvous round trip (long-haul links raise NCCL_IB_TIMEOUT)\n"
               "  --params         print every environment variable libcomm reads, with defaults and docs\n"
               "  --version        libcomm's release and git commit\n");
}

int parse(int argc, char** argv, Options* o) {
  static const option long_opts[] = {{"json", no_argument, nullptr, 'j'},         {"explain", no_argument, nullptr, 'e'},
                                     {"topology", required_argument, nullptr, 't'}, {"local-rank", required_argument, nullptr, 'l'},
                                     {"rtt-us", required_argument, nullptr, 'r'},   {"params", no_argument, nullptr, 'p'},
                                     {"version", no_argument, nullptr, 'V'},
                                     {"help", no_argument, nullptr, 'h'},           {nullptr, 0, nullptr, 0}};
  int c;
  opterr = 0;  // a bad option gets one line of ours, not getopt's and the whole usage
  while ((c = getopt_long(argc, argv, ":jet:l:r:ph", long_opts, nullptr)) != -1) {
    char* end = nullptr;
    switch (c) {
      case 'j': o->json = true; break;
      case 'e': o->explain = true; break;
      case 'p': o->params = true; break;
      case 't': o->topology = optarg; break;
      case 'l':
        o->local_rank = static_cast<int>(std::strtol(optarg, &end, 10));
        if (*end != '\0' || o->local_rank < 0) {
          std::fprintf(stderr, "comm-topo: --local-rank '%s' is not a rank (0, 1, ...)\n", optarg);
          return 2;
        }
        break;
      case 'r':
        o->rtt_us = std::strtod(optarg, &end);
        if (*end != '\0' || o->rtt_us < 0) {
          std::fprintf(stderr, "comm-topo: --rtt-us '%s' is not a number of microseconds\n", optarg);
          return 2;
        }
        break;
      case 'h': usage(stdout); std::exit(0);
      case 'V': std::printf("comm-topo (libcomm %s)\n", comm::version::text()); std::exit(0);
      case ':': std::fprintf(stderr, "comm-topo: %s needs a value; see --help\n", argv[optind - 1]); return 2;
      default: std::fprintf(stderr, "comm-topo: unknown option '%s'; see --help\n", bad_option(argv).c_str()); return 2;
    }
  }
  if (optind < argc) {
    std::fprintf(stderr, "comm-topo: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  return 0;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& s : v) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

std::string num_or_dash(int v) { return v >= 0 ? std::to_string(v) : "-"; }

void print_devices(const topo::Topology& t) {
  std::printf("libcomm topology: %s%s%s\n", t.source.c_str(), t.machine.empty() ? "" : ", ", t.machine.c_str());
  std::printf("  %d package(s), %d NUMA node(s), %d core(s), %d PU(s)\n\n", t.packages, t.numa_nodes, t.cores, t.pus);

  if (t.gpus.empty()) {
    std::printf("GPUs: none found\n");
  } else {
    std::printf("GPUs (%zu):\n  %-3s %-13s %-5s %-6s %-28s %s\n", t.gpus.size(), "#", "bus id", "NUMA", "socket",
                "model", "found by");
    for (const auto& g : t.gpus)
      std::printf("  %-3d %-13s %-5s %-6s %-28s %s%s%s\n", g.index, g.busid.c_str(), num_or_dash(g.where.numa).c_str(),
                  num_or_dash(g.where.package).c_str(), g.model.substr(0, 28).c_str(), g.found_by.c_str(),
                  g.os_devices.empty() ? "" : "; ", join(g.os_devices, " ").c_str());
  }
  if (t.hcas.empty()) {
    std::printf("RDMA devices: none found\n");
  } else {
    std::printf("RDMA devices (%zu):\n  %-12s %-11s %-4s %-13s %-5s %-6s %-10s %s\n", t.hcas.size(), "name", "kind",
                "IB?", "bus id", "NUMA", "socket", "netdevs", "ports");
    for (const auto& h : t.hcas) {
      std::string ports;
      for (const auto& p : h.ports) {
        char speed[32] = "";
        if (p.gbps > 0) std::snprintf(speed, sizeof speed, "/%.0fGb/s", p.gbps);
        char buf[128];
        std::snprintf(buf, sizeof buf, "%s%d:%s%s%s%s", ports.empty() ? "" : " ", p.number,
                      p.state.empty() ? "?" : p.state.c_str(), p.link_layer.empty() ? "" : "/", p.link_layer.c_str(),
                      speed);
        ports += buf;
      }
      std::printf("  %-12s %-11s %-4s %-13s %-5s %-6s %-10s %s\n", topo::hca_label(h).c_str(), topo::to_string(h.kind),
                  h.usable_for_ib() ? "yes" : "no", h.busid.c_str(), num_or_dash(h.where.numa).c_str(),
                  num_or_dash(h.where.package).c_str(), join(h.netdevs, ",").c_str(), ports.c_str());
      std::printf("      %s\n", h.kind_reason.c_str());
    }
  }
  if (t.interfaces.empty()) {
    std::printf("Interfaces: none found\n");
  } else {
    std::printf("Interfaces (%zu):\n  %-14s %-5s %-9s %-13s %-5s %-9s %s\n", t.interfaces.size(), "name", "state",
                "kind", "bus id", "NUMA", "speed", "addresses");
    for (const auto& i : t.interfaces) {
      std::vector<std::string> addrs;
      for (const auto& a : i.addresses) addrs.push_back(a.text);
      std::string speed = i.speed_mbps > 0 ? std::to_string(i.speed_mbps) + "Mb/s" : "-";
      std::printf("  %-14s %-5s %-9s %-13s %-5s %-9s %s\n", i.name.c_str(), t.offline ? "?" : (i.up ? "up" : "down"),
                  i.kind.c_str(), i.busid.empty() ? "-" : i.busid.c_str(), num_or_dash(i.where.numa).c_str(),
                  speed.c_str(), t.offline ? "(not known: read from a file)" : join(addrs, " ").c_str());
    }
  }
}

void print_nvlink(const topo::Topology& t, const topo::Plan& p) {
  if (!p.nvlink.any()) {
    size_t self = 0;
    for (const auto& l : t.nvlinks) self += l.to_kind == topo::NvLink::End::kSelf;
    std::printf("NVLink: no NVLink path between GPUs");
    if (!t.nvlinks.empty()) std::printf(" (%zu NVLink entries, %zu of them naming their own GPU)", t.nvlinks.size(), self);
    std::printf("\n");
    return;
  }
  std::printf("NVLink (GB/s from row GPU to column GPU; D direct, S through NVSwitch; %zu NVSwitch(es)):\n     ",
              t.nvswitches.size());
  for (size_t j = 0; j < p.nvlink.gbps.size(); ++j) std::printf("%6zu", j);
  std::printf("\n");
  for (size_t i = 0; i < p.nvlink.gbps.size(); ++i) {
    std::printf("  %-3zu", i);
    for (size_t j = 0; j < p.nvlink.gbps[i].size(); ++j) {
      char via = p.nvlink.via[i][j];
      if (via == 'D' || via == 'S')
        std::printf(" %4.0f%c", p.nvlink.gbps[i][j], via);
      else
        std::printf("%6s", via == 'X' ? "X" : "-");
    }
    std::printf("\n");
  }
}

void print_plan(const topo::Plan& p) {
  std::printf("\nPlan:\n  %-36s %-9s %-16s %s\n", "peer class", "host", "host paths", "GPU paths (NCCL)");
  for (const auto& peer : p.peers)
    std::printf("  %-36s %-9s %-16s %s\n", topo::to_string(peer.peer), peer.host_transport.c_str(),
                join(peer.host_paths, " > ").c_str(), peer.gpu_paths.empty() ? "- (no GPU)" : join(peer.gpu_paths, " > ").c_str());
  std::printf("  interfaces, in order of use:\n");
  for (const auto& i : p.interfaces) std::printf("    %-14s %s\n", i.name.c_str(), i.why.c_str());
  if (p.interfaces.empty()) std::printf("    none\n");
  std::printf("    (%s)\n", p.interface_rule.c_str());
  if (!p.gpus.empty()) {
    std::printf("  per GPU (HCA nearest by PCI path, rail-aligned; nearest chosen interface):\n");
    for (const auto& g : p.gpus) std::printf("    GPU %-3d %s\n", g.gpu, g.why.c_str());
  }
  if (!p.ib_hcas.empty())
    std::printf("  InfiniBand: NCCL_IB_TIMEOUT %d, NCCL_IB_RETRY_CNT %d: %.1f s before NCCL reports an error\n",
                p.ib.timeout, p.ib.retry_cnt, p.ib.seconds);
  if (!p.uses_nccl) {
    std::printf("  NCCL settings: none (no GPU: NCCL is not used)\n");
  } else if (p.nccl.empty()) {
    std::printf("  NCCL settings: none (NCCL's defaults fit)\n");
  } else {
    std::printf("  NCCL settings (applied at comm_init, before NCCL's first init; a user's value is never overridden):\n");
    for (const auto& s : p.nccl) {
      if (s.user_value.empty())
        std::printf("    %s=%s\n        %s\n", s.name.c_str(), s.value.c_str(), s.reason.c_str());
      else
        std::printf("    %s=%s (set by the user; libcomm would set %s)\n        %s\n", s.name.c_str(), s.user_value.c_str(),
                    s.value.c_str(), s.reason.c_str());
    }
  }
}

}  // namespace

// What this process loads for device buffers (this machine, also with --topology).
nlohmann::ordered_json device_json(const comm::device::Probe& p) {
  auto or_null = [](const std::string& s) { return s.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(s); };
  nlohmann::ordered_json ft = nlohmann::ordered_json::object();
  for (const auto& [call, has] : p.fault_tolerance) ft[call] = has;
  return {{"built_with_headers", p.built_with_headers},
          {"cuda_library", or_null(p.cuda_library)},
          {"cuda_runtime_version", p.cuda_runtime_version},
          {"cuda_driver_version", p.cuda_driver_version},
          {"cuda_devices", p.cuda_devices},
          {"nccl_library", or_null(p.nccl_library)},
          {"nccl_version", or_null(p.nccl_version)},
          {"nccl_usable", p.usable},
          {"why_not", or_null(p.why_not)},
          {"fault_tolerance", ft}};
}

void print_device(const comm::device::Probe& p) {
  std::printf("\nDevice buffers (this machine): %s\n", p.usable ? "NCCL" : "staged through pinned host memory, or unavailable");
  std::printf("  built with CUDA/NCCL headers: %s\n", p.built_with_headers ? "yes" : "no");
  std::printf("  NCCL: %s%s%s\n", p.nccl_library.empty() ? "not loaded" : p.nccl_library.c_str(),
              p.nccl_version.empty() ? "" : ", version ", p.nccl_version.c_str());
  std::printf("  CUDA runtime: %s, %d device(s)\n", p.cuda_library.empty() ? "not loaded" : p.cuda_library.c_str(),
              p.cuda_devices);
  if (!p.why_not.empty()) std::printf("  why not NCCL: %s\n", p.why_not.c_str());
  std::string ft;
  for (const auto& [call, has] : p.fault_tolerance) ft += (ft.empty() ? "" : ", ") + call + (has ? " yes" : " no");
  std::printf("  NCCL fault-tolerance calls: %s\n", ft.empty() ? "- (NCCL not loaded)" : ft.c_str());
}

int main(int argc, char** argv) {
  Options opt;
  if (int rc = parse(argc, argv, &opt)) return rc;
  if (opt.params) {
    std::fputs(comm::params::describe_all().c_str(), stdout);
    return 0;
  }
  topo::Topology t;
  comm::Status st = opt.topology.empty() ? topo::probe(topo::probe_options_from_env(), &t)
                                         : topo::load_topology_file(opt.topology, &t);
  if (!st.ok()) {
    std::fprintf(stderr, "comm-topo: %s\n", st.message().c_str());
    return 1;
  }
  topo::Config config = topo::config_from_env();
  if (!opt.topology.empty()) config.numa = -1;  // this process's NUMA node says nothing about the file's machine
  if (opt.local_rank >= 0) config.local_rank = opt.local_rank;
  if (opt.rtt_us >= 0) config.rendezvous_rtt_us = opt.rtt_us;
  topo::Plan plan = topo::make_plan(t, topo::Env::from_process(), config);

  const comm::device::Probe device = comm::device::probe_process();
  if (opt.json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(topo::to_json_text(t, plan));
    j["device"] = device_json(device);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  print_devices(t);
  print_nvlink(t, plan);
  print_plan(plan);
  print_device(device);
  if (!t.notes.empty()) {
    std::printf("\nNotes:\n");
    for (const auto& n : t.notes) std::printf("  - %s\n", n.c_str());
  }
  if (opt.explain) {
    std::printf("\nDecisions (topic: choice -- rule):\n");
    for (const auto& d : plan.decisions)
      std::printf("  %s: %s\n      %s\n", d.topic.c_str(), d.choice.c_str(), d.rule.c_str());
  }
  return 0;
}

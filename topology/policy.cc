// The path policy. Pure: everything it knows comes in through (Topology, Env, Config), so each
// rule is tested on fixture machines and made-up environments, and explained in the Plan.
#include "policy.h"

#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "interfaces.h"

namespace comm::topology {
namespace {

int rank_of(PathKind p) { return static_cast<int>(p); }  // kUnknown sorts last

std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (const auto& s : items) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// "mlx5_2" before "mlx5_10".
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      long x = std::strtol(a.substr(i, ie - i).c_str(), nullptr, 10), y = std::strtol(b.substr(j, je - j).c_str(), nullptr, 10);
      if (x != y) return x < y;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// An integer environment value in [lo, hi], or nullopt (unset or malformed).
std::optional<int> int_in(const std::string& text, int lo, int hi) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || v < lo || v > hi) return std::nullopt;
  return static_cast<int>(v);
}

struct Anchor {
  Locality where;
  std::string name;  // "GPU 0", "NUMA node 1", "" unknown
};

Anchor anchor_for(const Topology& topo, const Config& config) {
  Anchor a;
  if (!topo.gpus.empty()) {
    size_t k = static_cast<size_t>(std::max(0, config.local_rank)) % topo.gpus.size();
    a.where = topo.gpus[k].where;
    a.name = "GPU " + std::to_string(k);
  } else if (config.numa >= 0) {
    a.where.numa = config.numa;
    a.name = "this process (NUMA node " + std::to_string(config.numa) + ")";
  }
  return a;
}

// NCCL_IB_HCA has NCCL_SOCKET_IFNAME's list syntax plus optional ":port" suffixes; the
// transport's selector applies it to HCA names once the ports are stripped.
std::vector<const Hca*> filter_by_ib_hca(const std::vector<const Hca*>& hcas, const std::string& spec,
                                         std::string* why) {
  std::string names_only;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == std::string::npos) comma = spec.size();
    std::string item = spec.substr(start, comma - start);
    item = item.substr(0, item.find(':'));
    names_only += (start == 0 ? "" : ",") + item;
    start = comma + 1;
  }
  std::vector<Interface> as_list;
  for (const Hca* h : hcas) as_list.push_back({hca_label(*h), "0.0.0.0", AF_INET, true});
  std::vector<Interface> chosen;
  std::string ignored;
  Status st = select_interfaces(names_only, as_list, &chosen, &ignored);
  std::vector<const Hca*> out;
  for (const Hca* h : hcas)
    for (const auto& c : chosen)
      if (c.name == hca_label(*h)) {
        out.push_back(h);
        break;
      }
  *why = st.ok() ? "NCCL_IB_HCA='" + spec + "' keeps " + std::to_string(out.size()) + " of " +
                       std::to_string(hcas.size())
                 : "NCCL_IB_HCA='" + spec + "' matches none of the usable HCAs";
  return out;
}

class Planner {
 public:
  Planner(const Topology& topo, const Env& env, const Config& config) : topo_(topo), env_(env), config_(config) {}

  Plan run() {
    plan_.uses_nccl = !topo_.gpus.empty();
    plan_.nvlink = nvlink_matrix(topo_);
    choose_hcas();
    choose_peers();
    choose_interfaces();
    choose_gpu_pairs();
    choose_ib_timeout();
    choose_nccl_settings();
    return std::move(plan_);
  }

 private:
  void decide(std::string topic, std::string choice, std::string rule) {
    plan_.decisions.push_back({std::move(topic), std::move(choice), std::move(rule)});
  }

  void choose_hcas() {
    std::vector<const Hca*> usable;
    for (const auto& h : topo_.hcas) {
      bool ok = h.usable_for_ib();
      decide("RDMA device " + hca_label(h), std::string(to_string(h.kind)) + (ok ? ", usable for IB" : ", not used for IB"),
             h.kind_reason + (ok || !(h.kind == RdmaKind::kInfiniBand || h.kind == RdmaKind::kRoce)
                                  ? ""
                                  : "; no port is ACTIVE"));
      if (ok) usable.push_back(&h);
    }
    std::stable_sort(usable.begin(), usable.end(),
                     [](const Hca* a, const Hca* b) { return natural_less(hca_label(*a), hca_label(*b)); });
    if (env_.nccl_ib_hca.size() > 1 && !usable.empty()) {
      std::string why;
      usable = filter_by_ib_hca(usable, env_.nccl_ib_hca, &why);
      decide("HCAs", std::to_string(usable.size()) + " kept", why);
    }
    usable_ = usable;
    for (const Hca* h : usable_) plan_.ib_hcas.push_back(hca_label(*h));
    if (topo_.hcas.empty()) decide("HCAs", "none", "no RDMA device found");
  }

  void choose_peers() {
    std::string forced, source;
    // nccl is about device buffers: host buffers still take the plan's host transports.
    if (!config_.transport.empty() && config_.transport != "auto" && config_.transport != "nccl") {
      forced = config_.transport;
      source = "comm_config_t.transport";
    } else if (!env_.comm_transport.empty() && env_.comm_transport != "auto" && env_.comm_transport != "nccl") {
      forced = env_.comm_transport;
      source = "COMM_TRANSPORT";
    }
    const bool have_ib = !usable_.empty();
    const bool nvlink = plan_.nvlink.any();
    std::string not_ib;
    for (const auto& h : topo_.hcas)
      if (!h.usable_for_ib()) not_ib += (not_ib.empty() ? "" : ", ") + hca_label(h) + " is " + to_string(h.kind);
    for (PeerClass c : kPeerClasses) {
      PeerPlan p;
      p.peer = c;
      bool local = c != PeerClass::kOtherHost;
      p.host_paths = local ? std::vector<std::string>{"shm", "socket"}
                           : (have_ib ? std::vector<std::string>{"ucx", "socket"} : std::vector<std::string>{"socket"});
      if (plan_.uses_nccl) {
        if (local && nvlink) p.gpu_paths.push_back("nvlink");
        if (c == PeerClass::kSameProcess || c == PeerClass::kSameNuma) p.gpu_paths.push_back("pcie-p2p");
        if (local) p.gpu_paths.push_back("shm");
        if (!local && have_ib) p.gpu_paths.push_back("ib");
        if (!local) p.gpu_paths.push_back("socket");
      }
      for (const auto& t : p.host_paths)
        if (p.host_transport.empty() && contains(config_.host_transports, t)) p.host_transport = t;
      if (p.host_transport.empty()) p.host_transport = "socket";
      if (!forced.empty()) {
        p.host_transport = forced;
        p.why = source + "=" + forced + " forces it for every peer";
      } else if (c == PeerClass::kSameProcess) {
        p.why = "ranks in one process share their address space: shared memory";
      } else if (c == PeerClass::kSameNuma) {
        p.why = "same host: shared memory, local to both ranks' NUMA node";
      } else if (c == PeerClass::kOtherNuma) {
        p.why = "same host: shared memory across the socket interconnect still beats the network stack";
      } else if (have_ib) {
        p.why = "InfiniBand/RoCE HCA(s) " + join(plan_.ib_hcas) + ": UCX for host buffers" +
                (p.host_transport == "ucx" ? ""
                                           : "; UCX is not available here (not in this build, or its library did not "
                                             "load: COMM_DEBUG=INFO says why), so TCP sockets");
      } else {
        p.why = "no InfiniBand/RoCE HCA" + (not_ib.empty() ? std::string() : " (" + not_ib + ")") + ": TCP sockets";
      }
      decide(std::string("host transport, ") + to_string(c), p.host_transport, p.why);
      if (plan_.uses_nccl) {
        std::string rule = local ? (nvlink ? "NVLink where the matrix shows a path, else " : "no NVLink; ") +
                                       std::string(c == PeerClass::kOtherNuma
                                                       ? "NCCL keeps PCIe P2P off across sockets (SYS): shared memory"
                                                       : "PCIe P2P, then shared memory")
                                 : (have_ib ? "NCCL's IB transport (GPUDirect RDMA where GPU and HCA share a switch), "
                                              "then sockets"
                                            : "no InfiniBand/RoCE HCA: NCCL's socket transport");
        decide(std::string("GPU paths, ") + to_string(c), join(p.gpu_paths), rule);
      }
      plan_.peers.push_back(p);
    }
  }

  void choose_interfaces() {
    std::string spec = env_.comm_socket_ifname.empty() ? env_.nccl_socket_ifname : env_.comm_socket_ifname;
    const char* var = env_.comm_socket_ifname.empty() ? "NCCL_SOCKET_IFNAME" : "COMM_SOCKET_IFNAME";
    for (const auto& itf : topo_.interfaces) {
      if (topo_.offline) {
        candidates_.push_back({itf.name, "(from file)", AF_INET, itf.up});
        continue;
      }
      for (const auto& a : itf.addresses) candidates_.push_back({itf.name, a.text, a.family, itf.up});
    }
    std::vector<Interface> chosen;
    std::string why;
    Status st = select_interfaces(spec, candidates_, &chosen, &why);
    if (!st.ok()) {
      if (topo_.offline && topo_.interfaces.empty()) st = Status(st.code(), "the topology file lists no network interface");
      plan_.interface_rule = st.message();
      decide("interfaces", "none", st.message());
      return;
    }
    if (std::string(var) == "COMM_SOCKET_IFNAME" && why.rfind("NCCL_SOCKET_IFNAME", 0) == 0)
      why.replace(0, 18, "COMM_SOCKET_IFNAME");
    std::vector<const NetInterface*> picked;
    for (const auto& c : chosen)
      for (const auto& itf : topo_.interfaces)
        if (itf.name == c.name && std::find(picked.begin(), picked.end(), &itf) == picked.end()) picked.push_back(&itf);
    Anchor anchor = anchor_for(topo_, config_);
    // Physical, then virtual, then loopback (which never reaches another host); nearest first.
    auto tier = [](const NetInterface* i) { return i->kind == "loopback" ? 2 : i->physical ? 0 : 1; };
    std::stable_sort(picked.begin(), picked.end(), [&](const NetInterface* a, const NetInterface* b) {
      if (tier(a) != tier(b)) return tier(a) < tier(b);
      return rank_of(path_between(a->where, anchor.where)) < rank_of(path_between(b->where, anchor.where));
    });
    for (const NetInterface* itf : picked) {
      std::string text = itf->kind.empty() ? (itf->physical ? "physical" : "virtual") : itf->kind;
      PathKind path = path_between(itf->where, anchor.where);
      if (!anchor.name.empty() && path != PathKind::kUnknown) text += ", " + anchor.name + " is on the " + to_string(path);
      if (itf->speed_mbps > 0) text += ", " + std::to_string(itf->speed_mbps) + " Mb/s";
      if (!itf->hca.empty()) text += ", on " + itf->hca;
      if (picked.size() == 1 && !itf->physical) text += "; the only candidate, so used although virtual";
      plan_.interfaces.push_back({itf->name, text});
    }
    plan_.interface_rule = why + "; among those, physical before virtual before loopback" +
                           (anchor.name.empty() ? std::string() : ", nearest to " + anchor.name + " first");
    std::vector<std::string> names;
    for (const auto& c : plan_.interfaces) names.push_back(c.name);
    decide("interfaces", join(names), plan_.interface_rule);
  }

  void choose_gpu_pairs() {
    std::vector<int> load(usable_.size(), 0);
    for (const auto& gpu : topo_.gpus) {
      GpuChoice g;
      g.gpu = gpu.index;
      // Nearest by PCI path first; among equals the least used, then the lowest rail, so that
      // GPU k gets the same rail on every identical host.
      int best = -1;
      for (size_t h = 0; h < usable_.size(); ++h) {
        if (best < 0) {
          best = static_cast<int>(h);
          continue;
        }
        int pb = rank_of(path_between(gpu.where, usable_[best]->where));
        int ph = rank_of(path_between(gpu.where, usable_[h]->where));
        if (ph < pb || (ph == pb && load[h] < load[static_cast<size_t>(best)])) best = static_cast<int>(h);
      }
      if (best >= 0) {
        const Hca& hca = *usable_[static_cast<size_t>(best)];
        load[static_cast<size_t>(best)]++;
        g.hca = hca_label(hca);
        g.hca_path = path_between(gpu.where, hca.where);
        g.rail = best;
        g.why = g.hca + ": " + to_string(g.hca_path) + " (" + nccl_name(g.hca_path) + "), rail " + std::to_string(best);
        if (load[static_cast<size_t>(best)] > 1) g.why += ", shared: more GPUs than equally near HCAs";
      } else {
        g.why = "no usable InfiniBand/RoCE HCA";
      }
      // The nearest chosen interface; among equals the one on the GPU's own HCA (IPoIB, RoCE).
      int best_itf = -1, best_key = 0;
      for (size_t i = 0; i < plan_.interfaces.size(); ++i) {
        const NetInterface* itf = find_interface(plan_.interfaces[i].name);
        PathKind p = itf ? path_between(gpu.where, itf->where) : PathKind::kUnknown;
        int key = rank_of(p) * 2 + (itf && !g.hca.empty() && itf->hca == g.hca ? 0 : 1);
        if (best_itf < 0 || key < best_key) {
          best_itf = static_cast<int>(i);
          best_key = key;
          g.interface_path = p;
        }
      }
      if (best_itf >= 0) {
        g.interface = plan_.interfaces[static_cast<size_t>(best_itf)].name;
        g.why += "; interface " + g.interface + " (" + to_string(g.interface_path) + ")";
      }
      decide("GPU " + std::to_string(gpu.index) + " (" + gpu.busid + ")", g.hca.empty() ? "no HCA" : g.hca,
             "one HCA per GPU, nearest by PCI path (same switch > same host bridge > same NUMA node > other "
             "socket), least shared, lowest rail: " + g.why);
      plan_.gpus.push_back(g);
    }
  }

  const NetInterface* find_interface(const std::string& name) const {
    for (const auto& itf : topo_.interfaces)
      if (itf.name == name) return &itf;
    return nullptr;
  }

  void choose_ib_timeout() {
    IbTimeout& ib = plan_.ib;
    if (auto r = int_in(env_.nccl_ib_retry_cnt, 0, 7)) {
      ib.retry_cnt = *r;
      retry_why_ = "NCCL_IB_RETRY_CNT=" + env_.nccl_ib_retry_cnt + " (set by the user)";
    } else {
      retry_why_ = "NCCL_IB_RETRY_CNT 7: NCCL's default, the most the 3-bit field holds";
    }
    bool rtt_long = config_.rendezvous_rtt_us && *config_.rendezvous_rtt_us > config_.long_haul_rtt_us;
    if (auto t = int_in(env_.nccl_ib_timeout, 0, 31)) {
      ib.timeout = *t;
      timeout_why_ = "NCCL_IB_TIMEOUT=" + env_.nccl_ib_timeout + " (set by the user)";
    } else {
      std::string bad = env_.nccl_ib_timeout.empty() ? "" : "NCCL_IB_TIMEOUT='" + env_.nccl_ib_timeout + "' is not 0-31; ";
      if (env_.cross_zone) {
        ib.timeout = 23;
        timeout_why_ = bad + "COMM_CROSS_ZONE=1: cross-zone/long-haul links, 23 as cloud guides recommend";
      } else if (rtt_long) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "rendezvous round trip %.0f us > %.0f us (long-haul links): 23 as cloud guides recommend",
                      *config_.rendezvous_rtt_us, config_.long_haul_rtt_us);
        ib.timeout = 23;
        timeout_why_ = bad + buf;
      } else {
        ib.timeout = 20;
        timeout_why_ = bad + "NCCL's default 20 (no COMM_CROSS_ZONE=1, no long round trip)";
      }
    }
    ib.seconds = ib_timeout_seconds(ib.timeout, ib.retry_cnt);
    char buf[160];
    std::snprintf(buf, sizeof buf, "4.096 us x 2^%d x %d = %.1f s before NCCL reports an error", ib.timeout,
                  std::max(1, ib.retry_cnt), ib.seconds);
    budget_ = buf;
    ib.why = timeout_why_ + "; " + retry_why_ + "; " + budget_;
    decide("NCCL_IB_TIMEOUT", std::to_string(ib.timeout) + (usable_.empty() ? " (unused: no InfiniBand/RoCE HCA)" : ""),
           ib.why);
  }

  void add_setting(const std::string& name, const std::string& value, const std::string& reason, const std::string& user) {
    NcclSetting s{name, value, reason, user};
    decide(name, user.empty() ? value : user + " (user's; libcomm would set " + value + ")",
           user.empty() ? reason : "set by the user: never overridden (libcomm's reason: " + reason + ")");
    plan_.nccl.push_back(s);
  }

  void choose_nccl_settings() {
    if (!plan_.uses_nccl) {
      decide("NCCL settings", "none", "no GPU: NCCL is not used, so no NCCL_* variable is set");
      return;
    }
    if (!usable_.empty()) {
      add_setting("NCCL_IB_TIMEOUT", std::to_string(plan_.ib.timeout), timeout_why_ + "; " + budget_,
                  env_.nccl_ib_timeout);
      add_setting("NCCL_IB_RETRY_CNT", std::to_string(plan_.ib.retry_cnt), retry_why_ + "; " + budget_,
                  env_.nccl_ib_retry_cnt);
      std::vector<std::string> excluded;
      bool all_named = true;
      for (const auto& h : topo_.hcas) {
        if (!contains(plan_.ib_hcas, hca_label(h))) excluded.push_back(hca_label(h) + " (" + to_string(h.kind) + ")");
        all_named = all_named && !h.name.empty();
      }
      if ((!excluded.empty() || !env_.nccl_ib_hca.empty()) && all_named)
        add_setting("NCCL_IB_HCA", "=" + join(plan_.ib_hcas, ","), "only InfiniBand/RoCE HCAs with a live port; leaves out " +
                    (excluded.empty() ? std::string("nothing") : join(excluded)), env_.nccl_ib_hca);
    }
    if (!plan_.interfaces.empty()) {
      if (!env_.comm_socket_ifname.empty()) {
        add_setting("NCCL_SOCKET_IFNAME", env_.comm_socket_ifname,
                    "COMM_SOCKET_IFNAME=" + env_.comm_socket_ifname + ": NCCL's bootstrap uses the same interfaces",
                    env_.nccl_socket_ifname);
      } else {
        std::vector<Interface> nccl_default;
        std::string ignored;
        Status st = select_interfaces("", candidates_, &nccl_default, &ignored);
        const std::string& ours = plan_.interfaces.front().name;
        if (st.ok() && !nccl_default.empty() && nccl_default.front().name != ours)
          add_setting("NCCL_SOCKET_IFNAME", "=" + ours,
                      "NCCL's default order would take " + nccl_default.front().name + " first; " + ours + " is " +
                          plan_.interfaces.front().why,
                      env_.nccl_socket_ifname);
      }
    }
    if (plan_.nccl.empty()) decide("NCCL settings", "none", "NCCL's defaults fit this machine");
  }

  const Topology& topo_;
  const Env& env_;
  const Config& config_;
  Plan plan_;
  std::vector<const Hca*> usable_;
  std::vector<Interface> candidates_;
  std::string timeout_why_, retry_why_, budget_;
};

}  // namespace

const char* to_string(PeerClass c) {
  switch (c) {
    case PeerClass::kSameProcess: return "same process";
    case PeerClass::kSameNuma: return "same host, same NUMA node";
    case PeerClass::kOtherNuma: return "same host, other NUMA node/socket";
    case PeerClass::kOtherHost: return "other host";
  }
  return "?";
}

const char* id_of(PeerClass c) {
  switch (c) {
    case PeerClass::kSameProcess: return "same_process";
    case PeerClass::kSameNuma: return "same_numa";
    case PeerClass::kOtherNuma: return "other_numa";
    case PeerClass::kOtherHost: return "other_host";
  }
  return "?";
}

const PeerPlan& Plan::peer(PeerClass c) const {
  for (const auto& p : peers)
    if (p.peer == c) return p;
  static const PeerPlan kNone;
  return kNone;
}

std::string Plan::host_transport_digest() const {
  std::string out;
  for (const auto& p : peers) out += std::string(out.empty() ? "" : ",") + id_of(p.peer) + "=" + p.host_transport;
  return out;
}

double ib_timeout_seconds(int timeout, int retry_cnt) {
  return 4.096e-6 * std::ldexp(1.0, timeout) * std::max(1, retry_cnt);
}

std::string hca_label(const Hca& hca) { return hca.name.empty() ? hca.busid : hca.name; }

Plan make_plan(const Topology& topo, const Env& env, const Config& config) { return Planner(topo, env, config).run(); }

}  // namespace comm::topology

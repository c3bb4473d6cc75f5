#include "plan_json.h"

#include <sys/socket.h>

#include <nlohmann/json.hpp>

namespace comm::topology {
namespace {

using nlohmann::json;

json optional_int(int v) { return v >= 0 ? json(v) : json(nullptr); }

json locality(const Locality& w) {
  return {{"numa", optional_int(w.numa)}, {"package", optional_int(w.package)}, {"pci_path", w.bridges}};
}

const char* end_name(NvLink::End e) {
  switch (e) {
    case NvLink::End::kGpu: return "gpu";
    case NvLink::End::kNvSwitch: return "nvswitch";
    case NvLink::End::kCpu: return "cpu";
    case NvLink::End::kSelf: return "self";
    case NvLink::End::kOther: break;
  }
  return "other";
}

json topology_json(const Topology& t) {
  json j;
  j["source"] = t.source;
  j["offline"] = t.offline;
  j["machine"] = t.machine;
  j["packages"] = t.packages;
  j["numa_nodes"] = t.numa_nodes;
  j["cores"] = t.cores;
  j["pus"] = t.pus;
  j["gpus"] = json::array();
  for (const auto& g : t.gpus) {
    json e = {{"index", g.index}, {"busid", g.busid}, {"model", g.model}, {"os_devices", g.os_devices},
              {"found_by", g.found_by}};
    e.update(locality(g.where));
    j["gpus"].push_back(e);
  }
  j["hcas"] = json::array();
  for (const auto& h : t.hcas) {
    json ports = json::array();
    for (const auto& p : h.ports)
      ports.push_back({{"number", p.number}, {"state", p.state}, {"link_layer", p.link_layer}, {"gbps", p.gbps}});
    json e = {{"name", hca_label(h)}, {"busid", h.busid}, {"kind", to_string(h.kind)}, {"kind_reason", h.kind_reason},
              {"usable_for_ib", h.usable_for_ib()}, {"netdevs", h.netdevs}, {"ports", ports}};
    e.update(locality(h.where));
    j["hcas"].push_back(e);
  }
  j["interfaces"] = json::array();
  for (const auto& i : t.interfaces) {
    json addrs = json::array();
    for (const auto& a : i.addresses)
      addrs.push_back({{"address", a.text}, {"family", a.family == AF_INET6 ? "ipv6" : "ipv4"}});
    json e = {{"name", i.name},   {"up", i.up},     {"physical", i.physical},
              {"kind", i.kind},   {"busid", i.busid}, {"hca", i.hca},
              {"speed_mbps", i.speed_mbps > 0 ? json(i.speed_mbps) : json(nullptr)}, {"addresses", addrs}};
    e.update(locality(i.where));
    j["interfaces"].push_back(e);
  }
  j["nvswitches"] = t.nvswitches;
  j["nvlinks"] = json::array();
  for (const auto& l : t.nvlinks)
    j["nvlinks"].push_back({{"from", l.from}, {"to", l.to}, {"to_kind", end_name(l.to_kind)}, {"links", l.links},
                            {"gbps", l.gbps}});
  j["notes"] = t.notes;
  return j;
}

json plan_json(const Plan& p) {
  json j;
  j["peers"] = json::array();
  for (const auto& peer : p.peers)
    j["peers"].push_back({{"class", id_of(peer.peer)}, {"description", to_string(peer.peer)},
                          {"host_transport", peer.host_transport}, {"host_paths", peer.host_paths},
                          {"gpu_paths", peer.gpu_paths}, {"why", peer.why}});
  j["host_transport_digest"] = p.host_transport_digest();
  j["interfaces"] = json::array();
  for (const auto& i : p.interfaces) j["interfaces"].push_back({{"name", i.name}, {"why", i.why}});
  j["interface_rule"] = p.interface_rule;
  j["gpus"] = json::array();
  for (const auto& g : p.gpus)
    j["gpus"].push_back({{"gpu", g.gpu},
                         {"hca", g.hca.empty() ? json(nullptr) : json(g.hca)},
                         {"hca_path", to_string(g.hca_path)},
                         {"hca_path_nccl", nccl_name(g.hca_path)},
                         {"rail", optional_int(g.rail)},
                         {"interface", g.interface.empty() ? json(nullptr) : json(g.interface)},
                         {"interface_path", to_string(g.interface_path)},
                         {"why", g.why}});
  j["ib_hcas"] = p.ib_hcas;
  j["ib_timeout"] = {{"timeout", p.ib.timeout}, {"retry_cnt", p.ib.retry_cnt}, {"seconds", p.ib.seconds}, {"why", p.ib.why}};
  j["uses_nccl"] = p.uses_nccl;
  j["nccl"] = json::array();
  for (const auto& s : p.nccl)
    j["nccl"].push_back({{"name", s.name}, {"value", s.value}, {"reason", s.reason},
                         {"user_value", s.user_value.empty() ? json(nullptr) : json(s.user_value)}});
  json matrix = json::array(), via = json::array();
  for (size_t i = 0; i < p.nvlink.gbps.size(); ++i) {
    matrix.push_back(p.nvlink.gbps[i]);
    via.push_back(std::string(p.nvlink.via[i].begin(), p.nvlink.via[i].end()));
  }
  j["nvlink"] = {{"gbps", matrix}, {"via", via}};
  j["decisions"] = json::array();
  for (const auto& d : p.decisions) j["decisions"].push_back({{"topic", d.topic}, {"choice", d.choice}, {"rule", d.rule}});
  return j;
}

}  // namespace

std::string to_json_text(const Topology& topo, const Plan& plan, int indent) {
  json doc = {{"schema", kJsonSchema}, {"topology", topology_json(topo)}, {"plan", plan_json(plan)}};
  return doc.dump(indent, ' ', false, json::error_handler_t::replace);
}

}  // namespace comm::topology

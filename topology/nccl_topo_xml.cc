// NCCL's topology XML (the NCCL_TOPO_FILE format: <system><cpu numaid><pci busid class>...<gpu>
// <nvlink target count tclass/></gpu><nic><net name/></nic>) -> Topology. Cloud VMs ship these
// files because the PCI tree the guest sees is virtual; the file holds the real GPU/NIC pairing.
// The format is a handful of attribute-only elements, so a small reader does; it is bounded
// (depth, size) because the file comes from outside.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "probe.h"

namespace comm::topology {
namespace {

struct XmlNode {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;
  std::vector<XmlNode> children;
  std::string attr(const char* key) const {
    for (const auto& [k, v] : attrs)
      if (k == key) return v;
    return "";
  }
};

class XmlReader {
 public:
  XmlReader(const std::string& text, const std::string& name) : s_(text), file_(name) {}

  Status document(XmlNode* root) {
    skip_misc();
    if (pos_ >= s_.size() || s_[pos_] != '<') return error("no root element");
    return element(root, 0);
  }

 private:
  static constexpr int kMaxDepth = 64;

  Status error(const std::string& what) const {
    return InvalidArgument("NCCL topology file '" + file_ + "', line " + std::to_string(line_) + ": " + what);
  }
  bool at(const char* lit) const { return s_.compare(pos_, std::char_traits<char>::length(lit), lit) == 0; }
  void advance(size_t n) {
    for (size_t i = 0; i < n && pos_ < s_.size(); ++i)
      if (s_[pos_++] == '\n') ++line_;
  }
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) advance(1);
  }
  bool skip_until(const char* lit) {
    size_t end = s_.find(lit, pos_);
    if (end == std::string::npos) return false;
    advance(end - pos_ + std::char_traits<char>::length(lit));
    return true;
  }
  // Whitespace, <?...?>, <!...>, comments: everything that is not an element.
  void skip_misc() {
    while (true) {
      skip_space();
      if (at("<!--")) {
        if (!skip_until("-->")) pos_ = s_.size();
      } else if (at("<?") || at("<!")) {
        if (!skip_until(">")) pos_ = s_.size();
      } else {
        return;
      }
    }
  }
  std::string name() {
    size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_' ||
                                s_[pos_] == '-' || s_[pos_] == ':' || s_[pos_] == '.'))
      ++pos_;
    return s_.substr(start, pos_ - start);
  }
  static std::string decode(const std::string& raw) {
    static const std::pair<const char*, char> kEntities[] = {
        {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    std::string out;
    for (size_t i = 0; i < raw.size(); ++i) {
      bool replaced = false;
      if (raw[i] == '&')
        for (const auto& [ent, ch] : kEntities)
          if (raw.compare(i, std::char_traits<char>::length(ent), ent) == 0) {
            out += ch;
            i += std::char_traits<char>::length(ent) - 1;
            replaced = true;
            break;
          }
      if (!replaced) out += raw[i];
    }
    return out;
  }

  Status element(XmlNode* node, int depth) {
    if (depth > kMaxDepth) return error("elements nested deeper than " + std::to_string(kMaxDepth));
    advance(1);  // '<'
    node->name = name();
    if (node->name.empty()) return error("expected an element name");
    while (true) {
      skip_space();
      if (pos_ >= s_.size()) return error("<" + node->name + "> is not closed");
      if (at("/>")) {
        advance(2);
        return Status::Ok();
      }
      if (s_[pos_] == '>') {
        advance(1);
        break;
      }
      std::string key = name();
      if (key.empty()) return error("unexpected '" + std::string(1, s_[pos_]) + "' in <" + node->name + ">");
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] != '=') return error("attribute " + key + " has no value");
      advance(1);
      skip_space();
      if (pos_ >= s_.size() || (s_[pos_] != '"' && s_[pos_] != '\'')) return error("attribute " + key + " is not quoted");
      char quote = s_[pos_];
      size_t end = s_.find(quote, pos_ + 1);
      if (end == std::string::npos) return error("attribute " + key + " is not closed");
      node->attrs.emplace_back(key, decode(s_.substr(pos_ + 1, end - pos_ - 1)));
      advance(end - pos_ + 1);
    }
    while (true) {
      size_t lt = s_.find('<', pos_);
      if (lt == std::string::npos) return error("<" + node->name + "> is not closed");
      advance(lt - pos_);  // text content carries nothing in this format
      if (at("</")) {
        advance(2);
        std::string closing = name();
        if (closing != node->name) return error("</" + closing + "> closes <" + node->name + ">");
        skip_space();
        if (pos_ >= s_.size() || s_[pos_] != '>') return error("</" + closing + " is not closed");
        advance(1);
        return Status::Ok();
      }
      if (at("<!--") || at("<?") || at("<!")) {
        skip_misc();
        continue;
      }
      node->children.emplace_back();
      COMM_RETURN_IF_ERROR(element(&node->children.back(), depth + 1));
    }
  }

  const std::string& s_;
  std::string file_;
  size_t pos_ = 0;
  int line_ = 1;
};

unsigned hex_attr(const XmlNode& n, const char* key) {
  return static_cast<unsigned>(std::strtoul(n.attr(key).c_str(), nullptr, 16));
}

int popcount_affinity(const std::string& mask) {
  int bits = 0;
  for (char c : mask)
    if (std::isxdigit(static_cast<unsigned char>(c))) bits += __builtin_popcount(std::strtoul(std::string(1, c).c_str(), nullptr, 16));
  return bits;
}

class Converter {
 public:
  explicit Converter(Topology* topo) : topo_(topo) {}

  void cpu(const XmlNode& cpu) {
    Locality where;
    where.numa = cpu.attr("numaid").empty() ? -1 : std::atoi(cpu.attr("numaid").c_str());
    where.bridges.push_back("cpu " + (cpu.attr("numaid").empty() ? std::to_string(topo_->numa_nodes) : cpu.attr("numaid")));
    topo_->numa_nodes++;
    topo_->pus += popcount_affinity(cpu.attr("affinity"));
    children(cpu, where, "");
  }

 private:
  void children(const XmlNode& parent, const Locality& where, const std::string& busid) {
    for (const auto& child : parent.children) {
      if (child.name == "pci") pci(child, where);
      if (child.name == "nic")
        for (const auto& net : child.children)
          if (net.name == "net") this->net(net, where, busid);
    }
  }

  void pci(const XmlNode& node, Locality where) {
    std::string busid = normalize_busid(node.attr("busid"));
    unsigned cls = hex_attr(node, "class");
    bool has_pci_children = false;
    for (const auto& c : node.children) has_pci_children |= c.name == "pci";
    if (has_pci_children || (cls >> 8) == 0x0604) {  // a bridge or (virtual) PCI switch
      where.bridges.push_back(busid);
      children(node, where, "");
      return;
    }
    const XmlNode* gpu = nullptr;
    for (const auto& c : node.children)
      if (c.name == "gpu") gpu = &c;
    if (gpu != nullptr || (cls >> 16) == 0x03) {
      add_gpu(node, gpu, busid, cls, where);
    } else if ((cls >> 8) == 0x0207 || (cls >> 8) == 0x0680) {
      if ((cls >> 8) == 0x0680) {
        topo_->nvswitches.push_back(busid);
        return;
      }
      bool named = false;
      for (const auto& c : node.children)
        if (c.name == "nic")
          for (const auto& n : c.children) named |= n.name == "net";
      if (!named) {
        Hca hca;
        hca.busid = busid;
        hca.kind = RdmaKind::kInfiniBand;
        hca.kind_reason = "PCI class 0x0207 (InfiniBand controller) in the NCCL topology file; no name given";
        hca.where = where;
        topo_->hcas.push_back(hca);
      }
    }
    children(node, where, busid);
  }

  void add_gpu(const XmlNode& node, const XmlNode* gpu, const std::string& busid, unsigned cls, const Locality& where) {
    Gpu g;
    g.busid = busid;
    char buf[96];
    std::snprintf(buf, sizeof buf, "NCCL topology file: <pci class 0x%06x>%s", cls, gpu ? " with <gpu>" : "");
    g.found_by = buf;
    g.where = where;
    if (!node.attr("device").empty()) g.model = "PCI device " + node.attr("device");
    if (gpu != nullptr) {
      int sm = std::atoi(gpu->attr("sm").c_str());
      if (sm > 0) g.model += (g.model.empty() ? "" : ", ") + std::string("sm ") + std::to_string(sm);
      for (const auto& link : gpu->children) {
        if (link.name != "nvlink") continue;
        NvLink e;
        e.from = busid;
        e.to = normalize_busid(link.attr("target"));
        e.links = std::max(1, std::atoi(link.attr("count").c_str()));
        e.gbps = e.links * nvlink_gbps_per_link(sm);
        unsigned tclass = hex_attr(link, "tclass");
        if (e.to == busid) {
          e.to_kind = NvLink::End::kSelf;
        } else if ((tclass >> 8) == 0x0680) {
          e.to_kind = NvLink::End::kNvSwitch;
          bool known = false;
          for (const auto& s : topo_->nvswitches) known |= s == e.to;
          if (!known) topo_->nvswitches.push_back(e.to);
        } else if ((tclass >> 16) == 0x03) {
          e.to_kind = NvLink::End::kGpu;
        } else if ((tclass >> 16) == 0x06) {
          e.to_kind = NvLink::End::kCpu;
        }
        topo_->nvlinks.push_back(e);
      }
    }
    topo_->gpus.push_back(g);
  }

  void net(const XmlNode& net, const Locality& where, const std::string& busid) {
    std::string name = net.attr("name");
    std::string reason;
    RdmaKind kind = rdma_kind_from_name(name, &reason);
    std::string guid = net.attr("guid");
    bool rdma = kind != RdmaKind::kUnknown || (!guid.empty() && std::strtoull(guid.c_str(), nullptr, 16) != 0);
    if (rdma) {
      Hca hca;
      hca.name = name;
      hca.busid = busid;
      hca.kind = kind == RdmaKind::kUnknown ? RdmaKind::kInfiniBand : kind;
      hca.kind_reason = kind == RdmaKind::kUnknown ? "NCCL topology file: <net> with a GUID" : reason;
      hca.where = where;
      topo_->hcas.push_back(hca);
      return;
    }
    NetInterface itf;
    itf.name = name;
    itf.busid = busid;
    itf.physical = true;
    itf.kind = "physical";
    if (!net.attr("speed").empty()) itf.speed_mbps = std::atoi(net.attr("speed").c_str());
    itf.where = where;
    topo_->interfaces.push_back(itf);
  }

  Topology* topo_;
};

}  // namespace

Status parse_nccl_topo_xml(const std::string& text, const std::string& name, Topology* topo) {
  if (text.size() > (16u << 20)) return InvalidArgument("NCCL topology file '" + name + "' is over 16 MiB");
  XmlNode root;
  COMM_RETURN_IF_ERROR(XmlReader(text, name).document(&root));
  if (root.name != "system")
    return InvalidArgument("NCCL topology file '" + name + "': root element is <" + root.name + ">, not <system>");
  topo->source = "NCCL topology " + name;
  topo->offline = true;
  Converter conv(topo);
  for (const auto& child : root.children)
    if (child.name == "cpu") conv.cpu(child);
  sort_gpus(topo);
  // A <nvlink> target that is another GPU is only known once every GPU is read.
  for (auto& e : topo->nvlinks)
    if (e.to_kind == NvLink::End::kOther && topo->gpu_by_busid(e.to)) e.to_kind = NvLink::End::kGpu;
  topo->notes.push_back("NCCL topology file: no package or core information; GPUs in PCI bus id order");
  return Status::Ok();
}

}  // namespace comm::topology

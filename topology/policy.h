// The path policy: a pure function (Topology, Env, Config) -> Plan. Which path each class of peer
// takes, which interfaces and which HCA each GPU uses, which NCCL_* settings a job gets, and the
// rule behind every choice. No I/O: tests feed it fixture topologies and made-up environments.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "topology.h"

namespace comm::topology {

enum class PeerClass { kSameProcess, kSameNuma, kOtherNuma, kOtherHost };
inline constexpr PeerClass kPeerClasses[] = {PeerClass::kSameProcess, PeerClass::kSameNuma, PeerClass::kOtherNuma,
                                             PeerClass::kOtherHost};
const char* to_string(PeerClass c);  // "same process", "same host, same NUMA node", ...
const char* id_of(PeerClass c);      // "same_process", "same_numa", "other_numa", "other_host"

// The environment as the policy sees it: values, "" when unset. from_process() reads the registry.
struct Env {
  std::string comm_socket_ifname;  // COMM_SOCKET_IFNAME (wins over NCCL_SOCKET_IFNAME, as in the transport)
  std::string nccl_socket_ifname;  // NCCL_SOCKET_IFNAME
  std::string nccl_ib_timeout;     // NCCL_IB_TIMEOUT
  std::string nccl_ib_retry_cnt;   // NCCL_IB_RETRY_CNT
  std::string nccl_ib_hca;         // NCCL_IB_HCA
  std::string comm_transport;      // COMM_TRANSPORT ("" or "auto": the plan decides)
  bool cross_zone = false;         // COMM_CROSS_ZONE=1
  static Env from_process();
};

struct Config {
  int local_rank = 0;  // the GPU this rank drives (LOCAL_RANK); also picks the interface nearest to it
  int numa = -1;       // the NUMA node this process runs on, for ranks without a GPU; -1 unknown
  std::optional<double> rendezvous_rtt_us;  // a measured round trip to the rendezvous store
  double long_haul_rtt_us = 1000;           // a round trip over this means long-haul links
  std::vector<std::string> host_transports = {"shm", "socket"};  // what this build implements
  std::string transport;                    // comm_config_t.transport: the API beats the environment
};

struct PeerPlan {
  PeerClass peer = PeerClass::kSameProcess;
  std::vector<std::string> gpu_paths;   // device buffers, through NCCL: nvlink, pcie-p2p, shm, ib, socket
  std::vector<std::string> host_paths;  // host buffers: shm, ucx (InfiniBand/RoCE), socket
  std::string host_transport;           // the first host path this build has (or the forced one)
  std::string why;
};

struct ChosenInterface {
  std::string name;
  std::string why;  // "physical, same NUMA node as GPU 0"
};

struct GpuChoice {
  int gpu = 0;
  std::string hca;  // "" when none is usable
  PathKind hca_path = PathKind::kUnknown;
  int rail = -1;    // position of the HCA among the usable ones: the same GPU index gets the same rail on every host
  std::string interface;
  PathKind interface_path = PathKind::kUnknown;
  std::string why;
};

struct IbTimeout {
  int timeout = 20;    // NCCL_IB_TIMEOUT: 4.096 us x 2^timeout per try
  int retry_cnt = 7;   // NCCL_IB_RETRY_CNT
  double seconds = 0;  // 4.096 us x 2^timeout x retry_cnt: how long before NCCL reports an error
  std::string why;
};

struct NcclSetting {
  std::string name;
  std::string value;       // what libcomm sets
  std::string reason;
  std::string user_value;  // non-empty: the user set it, and libcomm leaves it alone
};

struct Decision {
  std::string topic;   // "host transport, other host"
  std::string choice;  // "socket"
  std::string rule;    // "no InfiniBand/RoCE HCA: UCX has no RDMA path; sockets"
};

struct Plan {
  std::vector<PeerPlan> peers;              // one per PeerClass, in kPeerClasses order
  std::vector<ChosenInterface> interfaces;  // in order of use
  std::string interface_rule;
  std::vector<GpuChoice> gpus;              // one per GPU
  std::vector<std::string> ib_hcas;         // HCAs NCCL's IB transport and UCX may use
  IbTimeout ib;
  bool uses_nccl = false;                   // GPUs present: device buffers go through NCCL
  std::vector<NcclSetting> nccl;            // NCCL_* settings, applied before NCCL's first init
  std::vector<Decision> decisions;          // every choice and the rule that made it (comm-topo --explain)
  NvlinkMatrix nvlink;

  const PeerPlan& peer(PeerClass c) const;
  // What every rank must agree on: the host transport per class of peer.
  std::string host_transport_digest() const;
};

Plan make_plan(const Topology& topo, const Env& env, const Config& config);

// 4.096 us x 2^timeout x retries: how long NCCL's IB transport keeps trying before an error.
double ib_timeout_seconds(int timeout, int retry_cnt);

// The HCA as a user names it: its OpenFabrics name, or its PCI function when a file gave no name.
std::string hca_label(const Hca& hca);

}  // namespace comm::topology

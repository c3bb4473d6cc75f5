// Reachability proven at init (reachability.h). Cost: nothing for a job on one host or whose
// hosts each publish one address (no probe, no store round); otherwise one prober per host
// dials the addresses of at most kPeerHosts other hosts at once (a few dozen handshakes, the
// clean ones answered in a millisecond, an unanswered one given up 250 ms after its host
// answered elsewhere, else at COMM_SOCKET_CONNECT_TIMEOUT_MS), then one contribution per prober
// and rank 0's summary to every rank the way the init verdict went: down its tree (rank 0's store
// serves its own children and digests to the others, not the summary to every rank).
#include "reachability.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <sstream>

#include "deadline.h"
#include "log.h"
#include "posix/endpoints.h"
#include "posix/path_memory.h"
#include "posix/path_probe.h"

namespace comm {
namespace {

// Each host probes the next kPeerHosts hosts in host order, so it hears about the
// kPeerHosts before it too: both directions of 2 x kPeerHosts host pairs (the ring's and the
// tree's neighbours among them). Bounds the handshakes per prober at kPeerHosts x 8 addresses.
constexpr int kPeerHosts = 3;
// Happy Eyeballs' delay (RFC 8305): a host that answered on one address and not on another
// within this is not waited for longer on that one.
constexpr int kGraceMs = 250;
constexpr char kField = '\x1f';
// Rank 0's summary of the round, "OK\n<outcomes>" or "FAIL\n<why>", and its digest for the tree.
constexpr TreeValue kSummary = {TreeItem::kReachSummary, "init/reach", "init/reach/digest", "reachability summary",
                                log::kNet};

// One probe's outcome as every rank reads it from the summary.
struct Outcome {
  int prober = 0, target = 0;
  posix::ProbeResult r;
};

std::string encode(int prober, int target, const posix::ProbeResult& r) {
  std::string t = std::to_string(prober) + kField + std::to_string(target) + kField + r.hostport + kField + r.local_if +
                  kField + r.local_addr + kField + std::to_string(r.err) + kField + std::to_string(r.waited_ms) +
                  kField + (r.gave_up_early ? "1" : "0") + "\n";
  return t;
}

bool decode(const std::string& text, std::vector<Outcome>* out) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    std::vector<std::string> f;
    size_t pos = 0;
    for (;;) {
      const size_t end = line.find(kField, pos);
      f.push_back(line.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
      if (end == std::string::npos) break;
      pos = end + 1;
    }
    if (f.size() != 8) return false;
    Outcome o;
    try {
      o.prober = std::stoi(f[0]);
      o.target = std::stoi(f[1]);
      o.r.err = std::stoi(f[5]);
      o.r.waited_ms = std::stoi(f[6]);
    } catch (...) {
      return false;
    }
    o.r.hostport = f[2];
    o.r.local_if = f[3];
    o.r.local_addr = f[4];
    o.r.gave_up_early = f[7] == "1";
    out->push_back(std::move(o));
  }
  return true;
}

// What the job's table says: hosts, the first rank of each (its prober), their addresses.
struct Plan {
  int hosts = 0;
  std::vector<int> leader;                               // per host
  std::vector<std::vector<posix::Endpoint>> endpoints;  // per rank
  std::vector<std::vector<int>> targets;                 // per host: the hosts it probes
  std::vector<int> probers;                              // ranks that probe, ascending
};

bool make_plan(const ReachInput& in, Plan* p) {
  const int size = static_cast<int>(in.host_of.size());
  if (size < 2 || static_cast<int>(in.table.size()) != size) return false;
  for (int h : in.host_of) p->hosts = std::max(p->hosts, h + 1);
  if (p->hosts < 2) return false;
  p->leader.assign(static_cast<size_t>(p->hosts), -1);
  p->endpoints.resize(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    const int h = in.host_of[static_cast<size_t>(r)];
    if (h < 0 || !posix::decode_endpoints(in.table[static_cast<size_t>(r)], &p->endpoints[static_cast<size_t>(r)]))
      return false;
    if (p->leader[static_cast<size_t>(h)] < 0) p->leader[static_cast<size_t>(h)] = r;
  }
  std::vector<bool> multi(static_cast<size_t>(p->hosts));
  bool any = false;
  for (int h = 0; h < p->hosts; ++h) {
    const int l = p->leader[static_cast<size_t>(h)];
    if (l < 0) return false;
    multi[static_cast<size_t>(h)] = p->endpoints[static_cast<size_t>(l)].size() > 1;
    any = any || multi[static_cast<size_t>(h)];
  }
  if (!any) return false;  // one address per host: the dial has no choice to make
  p->targets.resize(static_cast<size_t>(p->hosts));
  for (int h = 0; h < p->hosts; ++h) {
    for (int d = 1; d <= std::min(kPeerHosts, p->hosts - 1); ++d) {
      const int t = (h + d) % p->hosts;
      if (multi[static_cast<size_t>(h)] || multi[static_cast<size_t>(t)]) p->targets[static_cast<size_t>(h)].push_back(t);
    }
    if (!p->targets[static_cast<size_t>(h)].empty()) p->probers.push_back(p->leader[static_cast<size_t>(h)]);
  }
  std::sort(p->probers.begin(), p->probers.end());
  return true;
}

// The prober's half: its handshakes, encoded.
std::string probe(const ReachInput& in, const Plan& p) {
  const int h = in.host_of[static_cast<size_t>(in.rank)];
  std::vector<std::vector<std::string>> groups;
  std::vector<int> target_rank;
  for (int t : p.targets[static_cast<size_t>(h)]) {
    const int l = p.leader[static_cast<size_t>(t)];
    groups.emplace_back();
    for (const auto& e : p.endpoints[static_cast<size_t>(l)]) groups.back().push_back(e.hostport);
    target_rank.push_back(l);
  }
  std::vector<std::vector<posix::ProbeResult>> results;
  posix::probe_paths(groups, in.connect_timeout_ms, kGraceMs, &results);
  std::string text;
  for (size_t g = 0; g < results.size(); ++g)
    for (const auto& r : results[g]) text += encode(in.rank, target_rank[g], r);
  return text;
}

// Rank 0's summary, and (the tree on) its digest after it.
Status publish_summary(Store& store, const ReachInput& in, const std::string& all) {
  COMM_RETURN_IF_ERROR(store.set(kSummary.key, all));
  if (in.tree == nullptr || !in.tree->on) return Status::Ok();
  return store.set(kSummary.digest_key, verdict_digest(all));
}

// The store round: probers contribute, rank 0 sums up, every rank gets the summary (down the
// verdict's tree: read_down_tree).
Status exchange(Store& store, const ReachInput& in, const Plan& p, const std::string& mine, std::string* summary) {
  const Deadline deadline = Deadline::after_ms(in.timeout_ms);
  const bool probes = std::binary_search(p.probers.begin(), p.probers.end(), in.rank);
  if (probes && in.rank != 0) COMM_RETURN_IF_ERROR(store.set("init/reach/" + std::to_string(in.rank), mine));
  if (in.rank == 0) {
    std::string all = "OK\n", problem;
    for (int r : p.probers) {
      std::string text = r == 0 ? mine : "";
      if (r != 0 && !store.get("init/reach/" + std::to_string(r), &text, deadline).ok()) {
        problem = "rank " + std::to_string(r) + " did not report its reachability probes within " +
                  std::to_string(in.timeout_ms) + " ms (COMM_TIMEOUT_MS; did it exit?)";
        break;
      }
      all += text;
    }
    if (!problem.empty()) {
      (void)publish_summary(store, in, "FAIL\n" + problem);
      return Timeout("rank 0: init's reachability round: " + problem);
    }
    COMM_RETURN_IF_ERROR(publish_summary(store, in, all));
    *summary = all.substr(3);
    return Status::Ok();
  }
  std::string all;
  InitTree no_tree;
  if (!read_down_tree(store, in.rank, kSummary, in.timeout_ms, in.tree != nullptr ? in.tree : &no_tree, deadline, &all)
           .ok())
    return Timeout("rank " + std::to_string(in.rank) + ": rank 0 did not finish init's reachability round within " +
                   std::to_string(in.timeout_ms) + " ms (COMM_TIMEOUT_MS)");
  if (all.rfind("FAIL\n", 0) == 0)
    return Timeout("rank " + std::to_string(in.rank) + ": init's reachability round: " + all.substr(5));
  if (all.rfind("OK\n", 0) != 0) return Internal("malformed reachability summary in the store");
  *summary = all.substr(3);
  return Status::Ok();
}

// What one failed probe says, from the side of the host that dialed: "no route to rank 1 at
// 10.76.0.2:41000 (EHOSTUNREACH)".
std::string dial_failure(const Outcome& o, const std::map<int, std::string>& answered_by) {
  const std::string who = "rank " + std::to_string(o.target);
  const std::string at = " at " + o.r.hostport;
  switch (o.r.err) {
    case EHOSTUNREACH:
    case ENETUNREACH:
      return "no route to " + who + at + " (" + posix::errno_name(o.r.err) + ")";
    case posix::kProbeOwnAddress:
      return who + "'s address " + posix::endpoint_host(o.r.hostport) +
             " is this host's own (an address every host has, as a container bridge's?)";
    case posix::kProbeNoAnswer: {
      std::string text = "no answer from " + who + at + " to the TCP handshake within " +
                         std::to_string(o.r.waited_ms) + " ms";
      auto it = answered_by.find(o.target);
      if (o.r.gave_up_early && it != answered_by.end()) text += " while its " + it->second + " answered";
      return text + " (no host there, or a firewall that drops packets?)";
    }
    default:
      return who + at + ": " + posix::probe_error_text(o.r.err, o.r.waited_ms);
  }
}

struct Interface {
  std::string name, address;
  std::set<int> reaches;            // ranks whose host it reaches both ways
  std::vector<std::string> dropped;  // why not, per path
};

// Seeds the path memory with both directions and says, once per rank, what was found.
void apply(const ReachInput& in, const Plan& p, const std::vector<Outcome>& all, Clock::time_point start) {
  const int my_host = in.host_of[static_cast<size_t>(in.rank)];
  std::vector<Interface> ifs;
  auto iface = [&ifs](const std::string& name, const std::string& address) -> Interface& {
    for (auto& i : ifs)
      if (i.name == name) return i;
    ifs.push_back(Interface{name, address, {}, {}});
    return ifs.back();
  };
  for (const auto& e : p.endpoints[static_cast<size_t>(in.rank)])
    (void)iface(e.ifname, posix::endpoint_host(e.hostport));
  // The interface of a target's address that answered, per target: "eth1 10.77.0.2:41000".
  std::map<int, std::string> answered_by;
  for (const auto& o : all) {
    if (o.r.err != 0 || in.host_of[static_cast<size_t>(o.prober)] != my_host) continue;
    for (const auto& e : p.endpoints[static_cast<size_t>(o.target)])
      if (e.hostport == o.r.hostport && !answered_by.count(o.target)) answered_by[o.target] = e.ifname + " " + e.hostport;
  }
  // This host's dials: what they found, per (local interface, peer address).
  struct Path {
    int target = 0;
    std::string local_addr;
    bool works = false;
  };
  std::map<std::pair<std::string, std::string>, Path> path;
  for (const auto& o : all) {
    if (in.host_of[static_cast<size_t>(o.prober)] != my_host) continue;
    const std::string host = posix::endpoint_host(o.r.hostport);
    const std::string why = o.r.err == 0 ? "" : dial_failure(o, answered_by);
    path[{o.r.local_if, host}] = Path{o.target, o.r.local_addr, o.r.err == 0};
    (void)posix::note_path(o.r.local_if, host, o.r.err == 0, why);
    if (o.r.err != 0) iface(o.r.local_if.empty() ? "(no route)" : o.r.local_if, o.r.local_addr).dropped.push_back(why);
  }
  // Other hosts' dials to this host that failed: the way back fails, so the path is not
  // trusted either way (an asymmetric path).
  for (const auto& o : all) {
    if (in.host_of[static_cast<size_t>(o.target)] != my_host || o.r.err == 0) continue;
    std::string mine_if;
    for (const auto& e : p.endpoints[static_cast<size_t>(o.target)])
      if (e.hostport == o.r.hostport) mine_if = e.ifname;
    // The way back: this host's interface toward the prober's address.
    posix::SockAddr back;
    std::string back_addr, back_if;
    const bool v6 = o.r.local_addr.find(':') != std::string::npos;
    if (!o.r.local_addr.empty() &&
        posix::parse_address(v6 ? "[" + o.r.local_addr + "]:1" : o.r.local_addr + ":1", &back).ok())
      (void)posix::route_toward(back, &back_addr, &back_if);
    std::string why = "rank " + std::to_string(o.prober) + " (from " + o.r.local_addr + ") cannot reach " +
                            o.r.hostport + ": " +
                            (o.r.err == posix::kProbeOwnAddress ? std::string("it is an address of its own host too")
                                                                : posix::probe_error_text(o.r.err, o.r.waited_ms));
    if (!o.r.local_addr.empty()) {
      (void)posix::note_path(back_if, o.r.local_addr, false, why);
      auto it = path.find({back_if, o.r.local_addr});
      if (it != path.end() && it->second.works) {
        it->second.works = false;
        why += " (this host reaches it there: a path that works one way only)";
      }
    }
    // Said under the interface its address is on, once per prober and address.
    Interface& i = iface(mine_if.empty() ? back_if : mine_if, posix::endpoint_host(o.r.hostport));
    if (std::find(i.dropped.begin(), i.dropped.end(), why) == i.dropped.end()) i.dropped.push_back(why);
  }
  for (const auto& [key, v] : path)
    if (v.works) iface(key.first, v.local_addr).reaches.insert(v.target);
  if (!log::enabled(log::Level::kInfo, log::kNet)) return;
  std::string text, using_ifs;
  for (const auto& i : ifs) {
    std::string name = i.name;
    if (!i.address.empty()) {
      name += ' ';  // appended apart: GCC 12 warns (-Wrestrict) on " " + a string
      name += posix::address_with_prefix(i.address);
    }
    std::string line;
    if (!i.reaches.empty()) {
      std::string ranks;
      for (int r : i.reaches) {
        if (!ranks.empty()) ranks += ',';
        ranks += std::to_string(r);
      }
      line = name + " reaches rank " + ranks + " both ways";
      using_ifs += (using_ifs.empty() ? "" : ",") + i.name;
      for (const auto& d : i.dropped) line += "; but " + d;
    } else if (!i.dropped.empty()) {
      line = name + ": ";
      for (size_t k = 0; k < i.dropped.size(); ++k) line += (k ? "; " : "") + i.dropped[k];
    } else {
      line = name + ": not probed (no probed host is reached through it)";
    }
    text += (text.empty() ? "" : " | ") + line;
  }
  bool any_dropped = false;
  for (const auto& i : ifs) any_dropped = any_dropped || (i.reaches.empty() && !i.dropped.empty());
  std::string tail;
  if (any_dropped)
    tail = using_ifs.empty() ? "; no interface of this host reaches the probed hosts both ways: connections to them "
                               "will fail (set NCCL_SOCKET_IFNAME or COMM_SOCKET_IFNAME to interfaces that do)"
                             : "; using " + using_ifs;
  const int leader = p.leader[static_cast<size_t>(my_host)];
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  COMM_INFO(kNet, "rank %d: reachability at init (TCP handshakes%s, both ways, COMM_SOCKET_CONNECT_TIMEOUT_MS=%d; "
            "probes and round %lld ms): %s%s",
            in.rank, leader == in.rank ? "" : (" by rank " + std::to_string(leader) + " on this host").c_str(),
            in.connect_timeout_ms, static_cast<long long>(took), text.c_str(), tail.c_str());
}

}  // namespace

Status prove_reachability(Store& store, const ReachInput& in) {
  const Clock::time_point start = Clock::now();
  Plan p;
  if (!make_plan(in, &p)) return Status::Ok();
  const bool probes = std::binary_search(p.probers.begin(), p.probers.end(), in.rank);
  const std::string mine = probes ? probe(in, p) : "";
  std::string summary;
  COMM_RETURN_IF_ERROR(exchange(store, in, p, mine, &summary));
  std::vector<Outcome> all;
  if (!decode(summary, &all)) return Internal("malformed reachability summary in the store");
  const int size = static_cast<int>(in.host_of.size());
  for (const auto& o : all)
    if (o.prober < 0 || o.prober >= size || o.target < 0 || o.target >= size)
      return Internal("malformed reachability summary in the store (a rank out of range)");
  apply(in, p, all, start);
  return Status::Ok();
}

}  // namespace comm

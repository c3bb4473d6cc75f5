// The init agreement (docs/design/base.md, "Rendezvous" and "Hot keys"): every rank contributes once
// to rank 0's store (its early listener, the address the store reached it by, the fingerprint
// of what must agree, its host); rank 0 publishes one verdict (the job secret, the host map, the
// address table) or why init fails, and the others read it, from their parent in the verdict's
// tree when they can, else from the store.
#include "init_agreement.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "interfaces.h"
#include "log.h"
#include "params.h"
#include "posix/endpoints.h"
#include "posix/socket.h"
#include "process_plan.h"
#include "registry.h"
#include "verdict_tree.h"
#include "version.h"

namespace comm {
namespace {

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

// Ranks are on one host when hostname, boot id and network namespace all match
// (simulated hosts live in separate namespaces), or when COMM_HOST_ID says so.
std::string host_identity() {
  if (auto id = params::env("COMM_HOST_ID")) return "id:" + *id;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  struct stat ns {};
  std::string netns = stat("/proc/self/ns/net", &ns) == 0 ? std::to_string(ns.st_ino) : "?";
  return std::string(host) + "|" + read_first_line("/proc/sys/kernel/random/boot_id") + "|" + netns;
}

namespace {


// What every rank must agree on, as ordered (name, value) pairs.
using Fingerprint = std::vector<std::pair<std::string, std::string>>;

Fingerprint fingerprint(int world_size, const CommSettings& s) {
  return {
      {"world size (WORLD_SIZE / comm_config_t.world_size)", std::to_string(world_size)},
      {"transport (COMM_TRANSPORT / comm_config_t.transport)", s.transport},
      {"timeout (COMM_TIMEOUT_MS / comm_config_t.timeout_ms)", std::to_string(s.timeout_ms)},
      {"tuning profile hash (COMM_TUNING_FILE)", s.tuning_hash},
      // A rank that never beats would look stopped to peers that expect it to.
      {"heartbeat (COMM_HEARTBEAT_MS)", std::to_string(s.heartbeat_ms)},
      // Strict mode adds an exchange to every call: all ranks or none.
      {"strict collective checks (COMM_CHECK_COLLECTIVES)", s.check_collectives ? "1" : "0"},
      // A rank with TLS and one without cannot talk: named here, before any data connection.
      {"TLS (COMM_TLS / comm_config_t.tls)", s.tls ? "1" : "0"},
      {"ABI version", std::to_string(COMM_ABI_VERSION_MAJOR) + "." + std::to_string(COMM_ABI_VERSION_MINOR)},
      {"host transport per peer class (topology plan)", topology::peer_transport_digest()},
  };
}

std::string encode(const Fingerprint& fp) {
  std::string text;
  for (const auto& [k, v] : fp) text += k + "\x1f" + v + "\x1e";
  return text;
}

Fingerprint decode(const std::string& text) {
  Fingerprint fp;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t sep = text.find('\x1f', pos), end = text.find('\x1e', pos);
    if (sep == std::string::npos || end == std::string::npos || sep > end) break;
    fp.emplace_back(text.substr(pos, sep - pos), text.substr(sep + 1, end - sep - 1));
    pos = end + 1;
  }
  return fp;
}

// "" when equal, else what differs, naming both ranks.
std::string compare(const Fingerprint& mine, int my_rank, const Fingerprint& theirs, int their_rank) {
  std::string diff;
  for (size_t i = 0; i < mine.size(); ++i) {
    std::string other = i < theirs.size() ? theirs[i].second : "(missing)";
    if (mine[i].second != other) {
      if (!diff.empty()) diff += "; ";
      diff += mine[i].first + ": rank " + std::to_string(my_rank) + " has '" + mine[i].second + "' but rank " +
              std::to_string(their_rank) + " has '" + other + "'";
    }
  }
  return diff;
}

std::string encode_hosts(const std::vector<int>& host_of) {
  std::string text;
  for (size_t r = 0; r < host_of.size(); ++r) {
    if (r > 0) text += ',';
    text += std::to_string(host_of[r]);
  }
  return text;
}

bool decode_hosts(const std::string& text, int size, std::vector<int>* host_of) {
  host_of->clear();
  size_t pos = 0;
  while (pos <= text.size() && static_cast<int>(host_of->size()) < size) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    if (item.empty() || item.size() > 9 || item.find_first_not_of("0123456789") != std::string::npos) return false;
    host_of->push_back(std::stoi(item));
    pos = end + 1;
  }
  return static_cast<int>(host_of->size()) == size;
}

// Whether the world's transport is likely to be one that adopts an early listener (its
// registry entry says so): forced, or the plan's choice for the peer class the guess says (the
// plan is known before the verdict).
bool early_listener_likely(const CommSettings& s, bool all_local) {
  std::string likely = s.transport;
  if (s.transport == "auto" || s.transport == "nccl")
    likely = topology::plan_for_process()
                 .peer(all_local ? topology::PeerClass::kSameNuma : topology::PeerClass::kOtherHost)
                 .host_transport;
  const transport::TransportInfo* t = transport::find(likely);
  return t != nullptr && t->listens_early;
}

// The world's socket listener, made before the init check so its address travels in the
// verdict: one contribution and one hot read per rank at init instead of two (docs/design/base.md,
// "Hot keys"). Where to listen depends on whether every rank is on this host, which only the
// verdict says; the launcher's LOCAL_WORLD_SIZE == WORLD_SIZE guesses it, and the address is
// tagged with the guess (L or R). Any rank's wrong guess, or a rank without a listener, makes
// the listener table unusable for every rank alike; the socket transport then listens and
// gathers the addresses through the store as before, and reports a failure to listen as before.
// Returns the tagged address, or "-" (no listener: socket unlikely, or listening failed).
std::string listen_early(const Identity& id, const CommSettings& s, std::shared_ptr<transport::EarlyListener>* out) {
  const bool guess_local = id.local_world_size > 0 && id.local_world_size == id.world_size;
  if (id.world_size < 2 || !early_listener_likely(s, guess_local)) return "-";
  std::vector<posix::LocalAddress> where;
  std::vector<posix::Endpoint> published;
  std::string why, skipped;
  auto early = std::make_shared<transport::EarlyListener>();
  Status st = topology::choose_socket_addresses(guess_local, &where, &why);
  // The backlog covers every peer dialing all its connections at once (the kernel caps it).
  if (st.ok()) st = posix::listen_on_each(where, id.world_size * 8 + 16, &early->fds, &published, &skipped);
  if (!st.ok()) {
    COMM_INFO(kNet, "rank %d: no listener before the init check (%s); the socket transport makes its own",
              id.rank, st.message().c_str());
    return "-";
  }
  if (!skipped.empty()) COMM_INFO(kNet, "rank %d: not listening on %s", id.rank, skipped.c_str());
  *out = std::move(early);
  std::string tagged(1, guess_local ? 'L' : 'R');
  tagged += posix::encode_endpoints(published);
  return tagged;
}

}  // namespace

std::string settings_fingerprint(const CommSettings& s) { return encode(fingerprint(0, s)); }

std::string settings_difference(const std::string& mine, int my_rank, const std::string& theirs, int their_rank) {
  return compare(decode(mine), my_rank, decode(theirs), their_rank);
}

namespace {

// A rank's one contribution to the init check, "init/rank/<r>":
// "<tagged listen address>\x1d<store reach address>\x1d<fingerprint>\x1d<host identity>"
// (the host last: COMM_HOST_ID may hold anything).
constexpr char kSep = '\x1d';

bool split_contribution(const std::string& text, std::string* addr, std::string* reach, std::string* fp,
                        std::string* host) {
  const size_t a = text.find(kSep);
  const size_t b = a == std::string::npos ? a : text.find(kSep, a + 1);
  const size_t c = b == std::string::npos ? b : text.find(kSep, b + 1);
  if (c == std::string::npos) return false;
  *addr = text.substr(0, a);
  *reach = text.substr(a + 1, b - a - 1);
  *fp = text.substr(b + 1, c - b - 1);
  *host = text.substr(c + 1);
  return true;
}

// The verdict's one address table, one entry per rank, serving both the world's socket mesh and
// comm_shrink's rescue store (docs/design/core.md, "Shrinking a communicator"):
//   "S host:port ..."  every rank's early listener, each made for what the verdict says (L:
//                      every rank on this host); the mesh adopts them, shrink meets at their host;
//   "H host ..."       otherwise: the address the store reached each rank by ("-": unknown),
//                      for shrink only; the socket transport gathers its addresses itself.
std::string address_table(const std::vector<std::string>& tagged, const std::vector<std::string>& reach,
                          bool all_local) {
  bool listeners = true;
  for (const auto& a : tagged) listeners = listeners && a.size() >= 2 && a[0] == (all_local ? 'L' : 'R');
  std::string table = listeners ? "S" : "H";
  for (size_t r = 0; r < tagged.size(); ++r) {
    table += ' ';
    if (listeners)
      table.append(tagged[r], 1);  // appended apart: GCC 12 warns (-Wrestrict) on " " + a.substr(1)
    else
      table += reach[r].empty() ? "-" : reach[r];
  }
  return table;
}

// The host of a table entry: "host:port", "[v6]:port" or a bare host.
// With several addresses (posix/endpoints.h), the first: the one on the route to the store.
std::string entry_host(const std::string& entry, bool has_port) {
  if (!has_port) return entry == "-" ? "" : entry;
  std::vector<posix::Endpoint> list;
  if (!posix::decode_endpoints(entry, &list)) return "";
  return posix::endpoint_host(list.front().hostport);
}

// Reads the verdict's table: the listener addresses (empty unless "S") and every rank's host.
bool decode_table(const std::string& text, int size, std::vector<std::string>* listeners,
                  std::vector<std::string>* hosts) {
  listeners->clear();
  hosts->clear();
  if (text.size() < 1 || (text[0] != 'S' && text[0] != 'H')) return false;
  const bool has_port = text[0] == 'S';
  std::istringstream in(text.substr(1));
  for (std::string a; in >> a;) {
    if (has_port) listeners->push_back(a);
    hosts->push_back(entry_host(a, has_port));
  }
  return static_cast<int>(hosts->size()) == size;
}

// A forced host-local transport with ranks on other hosts: why it cannot
// be, naming one such rank; "" when it can.
std::string local_transport_unavailable(const std::string& forced, const std::vector<int>& host_of) {
  const transport::TransportInfo* t = transport::find(forced);
  if (t == nullptr || !t->host_local) return "";
  const std::string across = transport::first_reaching_other_hosts();  // for the hint
  for (size_t r = 1; r < host_of.size(); ++r)
    if (host_of[r] != host_of[0])
      return "COMM_TRANSPORT=" + forced + " needs every rank on one host, but rank " + std::to_string(r) +
             " is on another host than rank 0 (hostname, boot id, network namespace or COMM_HOST_ID differ); "
             "use COMM_TRANSPORT=auto or " + across;
  return "";
}

// COMM_TEST_INIT_TREE=ACTION:RANK, a test hook (tests/core/test_init_tree.sh): that rank's verdict
// server answers with one byte flipped ("corrupt") or never ("stall"), or the rank exits
// right after its init contribution ("exit"; checked in agree). "" for every other rank.
Status test_tree_hook(int rank, std::string* action) {
  action->clear();
  std::string text;
  COMM_RETURN_IF_ERROR(params::get_string("COMM_TEST_INIT_TREE", &text));
  if (text.empty()) return Status::Ok();
  const size_t colon = text.find(':');
  if (colon == std::string::npos || text.substr(colon + 1).find_first_not_of("0123456789") != std::string::npos ||
      colon + 1 == text.size() || text.size() - colon > 10)
    return InvalidArgument("COMM_TEST_INIT_TREE='" + text + "': expected corrupt:RANK, stall:RANK or exit:RANK");
  if (std::stoi(text.substr(colon + 1)) == rank) *action = text.substr(0, colon);
  return Status::Ok();
}

// What agree() learns besides the secret.
struct Learned {
  bool all_local = false;
  std::vector<int> host_of;
  std::vector<std::string> listeners;  // every rank's early listener, "host:port"; empty: not usable
  std::vector<std::string> hosts;      // every rank's host for comm_shrink ("" unknown)
};

// The time a child gives its parent to answer before it reads the store (docs/design/base.md, "Hot
// keys"): a dead or stalled parent costs its children this, never their init.
int tree_slice_ms(int timeout_ms) { return std::clamp(timeout_ms / 8, 1000, 10000); }

// The value from the parent, checked against rank 0's digest; any failure is a status saying why.
Status fetch_from_parent(Store& store, int parent, const TreeValue& v, int timeout_ms, InitTree* tree,
                         Deadline deadline, std::string* value) {
  std::string digest;
  COMM_RETURN_IF_ERROR(store.get(v.digest_key, &digest, deadline).prefixed("no digest: "));
  const Deadline slice = Deadline::after_ms(tree_slice_ms(timeout_ms));
  if (tree->parent_entry.empty())
    COMM_RETURN_IF_ERROR(store.get("init/tree/" + std::to_string(parent), &tree->parent_entry, slice));
  const size_t sep = tree->parent_entry.find(kSep);
  const bool same_host = sep != std::string::npos && tree->parent_entry.substr(sep + 1) == tree->my_host;
  return fetch_verdict(v.item, tree->parent_entry.substr(0, sep), same_host, digest, slice, value);
}

constexpr TreeValue kVerdictValue = {TreeItem::kVerdict, "init/verdict", "init/digest", "init verdict", log::kInit};

// A rank other than 0 gets the verdict (read_down_tree). The read receipt goes to the store
// either way, so rank 0's "every rank has read it" stays exact.
Status read_verdict(Store& store, int rank, const CommSettings& s, InitTree* tree, Deadline deadline,
                    std::string* verdict) {
  if (!read_down_tree(store, rank, kVerdictValue, s.timeout_ms, tree, deadline, verdict).ok())
    return Timeout("rank 0 did not finish the init check within " + std::to_string(s.timeout_ms) + " ms");
  (void)confirm_read(store, "init/verdict", rank);
  return Status::Ok();
}

// Rank 0 collects every rank's one contribution (listener, reach address, fingerprint, host)
// and publishes one verdict: the job secret, every rank's host (numbered in order of each
// host's first rank) and the address table, or why init fails, so every rank fails the same
// way, naming the difference, or none does. With the tree, the other
// ranks get it from their parent (read_verdict) and pass it on to their children.
Status agree(Store& store, int rank, int size, const CommSettings& s, const std::string& my_addr, InitTree* tree,
             std::string* secret, Learned* out) {
  Deadline deadline = Deadline::after_ms(s.timeout_ms);
  Fingerprint mine = fingerprint(size, s);
  const std::string& my_host = tree->my_host;
  // A parent's listener, before the contribution: rank 0 publishes the digest only after every
  // contribution, so a child that has the digest finds its parent's address.
  if (tree->on && tree_has_children(rank, size))
    COMM_RETURN_IF_ERROR(store.set("init/tree/" + std::to_string(rank),
                                   (tree->server != nullptr ? tree->server->address() : "-") + kSep + my_host));
  // With the listener, the address the store reached this rank by: comm_shrink's survivors
  // meet at one of them when rank 0, and the store with it, is gone when no listener table is
  // usable (docs/design/core.md, "Shrinking a communicator").
  COMM_RETURN_IF_ERROR(store.set("init/rank/" + std::to_string(rank),
                                 my_addr + kSep + store.reach_address() + kSep + encode(mine) + kSep + my_host));
  if (tree->on) {
    std::string hook;
    COMM_RETURN_IF_ERROR(test_tree_hook(rank, &hook));
    // Test hook: a rank gone after joining; status 0, so that comm-run leaves the others running.
    if (hook == "exit") ::_exit(0);
  }
  if (rank == 0) {
    std::string problems;
    out->all_local = true;
    std::map<std::string, int> hosts = {{my_host, 0}};
    out->host_of.assign(static_cast<size_t>(size), 0);
    std::vector<std::string> tagged(static_cast<size_t>(size)), reach(static_cast<size_t>(size));
    tagged[0] = my_addr;
    reach[0] = store.reach_address();
    for (int r = 1; r < size; ++r) {
      std::string text, fp, host;
      Status st = store.get("init/rank/" + std::to_string(r), &text, deadline);
      if (!st.ok())
        return Timeout("rank " + std::to_string(r) + " never joined within " + std::to_string(s.timeout_ms) +
                       " ms (is it running, with the same MASTER_ADDR/MASTER_PORT or init_method?)");
      if (!split_contribution(text, &tagged[static_cast<size_t>(r)], &reach[static_cast<size_t>(r)], &fp, &host))
        return Internal("rank " + std::to_string(r) + "'s init contribution in the store is malformed (a libcomm of "
                        "another version? start every rank with the same libcomm)");
      std::string diff = compare(mine, 0, decode(fp), r);
      if (!diff.empty()) problems += (problems.empty() ? "" : "; ") + diff;
      out->all_local = out->all_local && host == my_host;
      auto [it, added] = hosts.emplace(host, static_cast<int>(hosts.size()));
      out->host_of[static_cast<size_t>(r)] = it->second;
    }
    COMM_RETURN_IF_ERROR(random_secret(secret));
    const std::string unavailable = problems.empty() ? local_transport_unavailable(s.transport, out->host_of) : "";
    const std::string table = address_table(tagged, reach, out->all_local);
    std::string verdict = !problems.empty()      ? "FAIL\n" + problems
                          : !unavailable.empty() ? "UNAV\n" + unavailable
                                                 : "OK\n" + *secret + (out->all_local ? "L" : "R") + "\n" +
                                                       encode_hosts(out->host_of) + "\n" + table + "\n" + encode(mine);
    COMM_RETURN_IF_ERROR(store.set("init/verdict", verdict));
    if (tree->on) {
      const std::string digest = verdict_digest(verdict);
      COMM_RETURN_IF_ERROR(store.set("init/digest", digest));
      COMM_INFO(kInit, "rank 0: init verdict %zu bytes, digest key %zu bytes (docs/design/base.md, \"Hot keys\")",
                verdict.size(), digest.size());
    }
    if (!problems.empty() || !unavailable.empty()) {
      // Stay until every rank has read the verdict: our process may hold the store.
      (void)wait_read_by_all(store, "init/verdict", size, deadline);
      if (!unavailable.empty()) return Unavailable(unavailable);
      return InvalidUsage("ranks disagree at init: " + problems + "; start every rank with the same settings");
    }
    if (!decode_table(table, size, &out->listeners, &out->hosts)) return Internal("rank 0 made a malformed address table");
    return Status::Ok();
  }
  std::string verdict;
  COMM_RETURN_IF_ERROR(read_verdict(store, rank, s, tree, deadline, &verdict));
  if (verdict.rfind("FAIL\n", 0) == 0)
    return InvalidUsage("ranks disagree at init: " + verdict.substr(5) + "; start every rank with the same settings");
  if (verdict.rfind("UNAV\n", 0) == 0) return Unavailable(verdict.substr(5));
  size_t nl = verdict.find('\n', 3);
  if (verdict.rfind("OK\n", 0) != 0 || nl == std::string::npos) return Internal("malformed init verdict in the store");
  if (nl < 4) return Internal("malformed init verdict in the store");
  out->all_local = verdict[nl - 1] == 'L';
  *secret = verdict.substr(3, nl - 4);
  size_t nl2 = verdict.find('\n', nl + 1);
  if (nl2 == std::string::npos || !decode_hosts(verdict.substr(nl + 1, nl2 - nl - 1), size, &out->host_of))
    return Internal("malformed host map in the init verdict");
  size_t nl3 = verdict.find('\n', nl2 + 1);
  if (nl3 == std::string::npos || !decode_table(verdict.substr(nl2 + 1, nl3 - nl2 - 1), size, &out->listeners, &out->hosts))
    return Internal("malformed address table in the init verdict (different world sizes, or a libcomm of another "
                    "version? start every rank with the same libcomm)");
  std::string diff = compare(mine, rank, decode(verdict.substr(nl3 + 1)), 0);
  if (!diff.empty())
    return InvalidUsage("ranks disagree at init: " + diff + "; start every rank with the same settings");
  return Status::Ok();
}

}  // namespace

Status read_down_tree(Store& store, int rank, const TreeValue& v, int timeout_ms, InitTree* tree, Deadline deadline,
                      std::string* value) {
  const int parent = tree_parent(rank);
  bool from_parent = false;
  if (tree->on && parent != 0 && tree->ask_parent) {
    Status st = fetch_from_parent(store, parent, v, timeout_ms, tree, deadline, value);
    if (st.code() == COMM_ERR_TIMEOUT && deadline.expired()) return st;  // the digest never came: nor will the value
    from_parent = st.ok();
    tree->ask_parent = from_parent;
    if (log::enabled(log::Level::kInfo, v.subsys)) {
      if (from_parent)
        log::write(log::Level::kInfo, v.subsys, "rank %d: %s from parent rank %d (digest checked)", rank, v.what, parent);
      else
        log::write(log::Level::kInfo, v.subsys, "rank %d: the %s from parent rank %d failed (%s); reading it from the "
                   "store", rank, v.what, parent, st.message().c_str());
    }
  }
  if (!from_parent) COMM_RETURN_IF_ERROR(store.get(v.key, value, deadline));
  if (tree->server != nullptr) tree->server->publish(v.item, *value);  // whatever it says: the children need it
  return Status::Ok();
}

Status agree_at_init(Store& store, const Identity& id, const CommSettings& s, std::string* secret, Agreed* out) {
  std::shared_ptr<transport::EarlyListener> early;
  const std::string my_addr = listen_early(id, s, &early);
  // The verdict's tree: its server lives as long as `out`, to the end of comm_init, so every
  // child (which reaches the init barrier only with the verdict) can have been served.
  InitTree& tree = out->tree;
  tree.my_host = host_identity();
  // Not under COMM_TLS: the verdict carries the job secret, and the tree's connections are plain
  // TCP; the store's are TLS.
  tree.on = store.dies_with_rank0() && id.world_size > 2 && !s.tls;
  if (tree.on && tree_has_children(id.rank, id.world_size)) {
    std::string hook;
    COMM_RETURN_IF_ERROR(test_tree_hook(id.rank, &hook));
    const bool guess_local = id.local_world_size > 0 && id.local_world_size == id.world_size;
    // The address on the route to the store: the interface that reaches rank 0 already.
    std::vector<posix::LocalAddress> where;
    std::string why;
    Status st = topology::choose_socket_addresses(guess_local, &where, &why);
    if (st.ok())
      st = VerdictServer::start(id.rank, where.front().address, where.front().family, guess_local, hook,
                                &out->tree_server);
    if (!st.ok())
      COMM_INFO(kInit, "rank %d: no listener for the init verdict's tree (%s); its children read the store",
                id.rank, st.message().c_str());
    tree.server = out->tree_server.get();
  }
  Learned learned;
  COMM_RETURN_IF_ERROR(agree(store, id.rank, id.world_size, s, my_addr, &tree, secret, &learned));
  out->all_local = learned.all_local;
  out->host_of = std::move(learned.host_of);
  out->hosts = std::move(learned.hosts);
  if (early && !learned.listeners.empty()) {
    early->table = std::move(learned.listeners);
    out->early = std::move(early);
  }
  return Status::Ok();
}

}  // namespace comm

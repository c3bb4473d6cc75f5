// Communicator lifecycle: rendezvous, the init agreement check, transport setup,
// children (dup/split) and teardown.
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "communicator.h"
#include "log.h"
#include "params.h"
#include "rendezvous.h"
#include "transports/routed/routed_transport.h"
#include "transports/shm/shm_transport.h"
#include "topology/process.h"
#include "tuning/nccl_settings.h"
#include "transports/nccl/device.h"
#include "transports/socket/socket_transport.h"
#include "transports/ucx/ucx_transport.h"

namespace comm {
namespace {

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

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

Status random_secret(std::string* out) {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return SystemError("getrandom failed: " + errno_string(errno));
    }
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  out->clear();
  for (unsigned char b : bytes) {
    out->push_back(hex[b >> 4]);
    out->push_back(hex[b & 15]);
  }
  return Status::Ok();
}

Status resolve_settings(const comm_config_t& cfg, CommSettings* s) {
  if (cfg.timeout_ms != COMM_UNSET) {
    if (cfg.timeout_ms <= 0)
      return InvalidArgument("comm_config_t.timeout_ms=" + std::to_string(cfg.timeout_ms) +
                             " must be positive (or COMM_UNSET)");
    s->timeout_ms = cfg.timeout_ms;
  } else {
    int64_t t = 0;
    COMM_RETURN_IF_ERROR(params::get_int("COMM_TIMEOUT_MS", 1, INT32_MAX, &t));
    s->timeout_ms = static_cast<int>(t);
  }
  if (cfg.transport != nullptr) {
    s->transport = cfg.transport;
  } else {
    COMM_RETURN_IF_ERROR(params::get_string("COMM_TRANSPORT", &s->transport));
  }
  for (auto& ch : s->transport) ch = static_cast<char>(tolower(static_cast<unsigned char>(ch)));
  if (s->transport == "ucx" && !transport::ucx_built())
    return Unavailable("transport 'ucx' is not available in this build (libucx-dev was not found when libcomm "
                       "was built); use COMM_TRANSPORT=auto, shm or socket");
  if (s->transport != "auto" && s->transport != "socket" && s->transport != "shm" && s->transport != "nccl" &&
      s->transport != "ucx")
    return InvalidArgument("transport '" + s->transport + "' is unknown; use auto, nccl, shm, socket or ucx");
  COMM_RETURN_IF_ERROR(params::get_string("COMM_ALGO", &s->forced_algo));
  int64_t chunk = 0;
  COMM_RETURN_IF_ERROR(params::get_int("COMM_CHUNK_BYTES", 4096, int64_t{1} << 30, &chunk));
  s->chunk_bytes = static_cast<size_t>(chunk);
  // Parsed before the rendezvous, so a bad profile fails every rank at once, naming the entry;
  // its hash joins what ranks must agree on (fingerprint below).
  return tuning::load_from_env(&s->profile, &s->tuning_hash);
}

// What every rank must agree on, as ordered (name, value) pairs.
using Fingerprint = std::vector<std::pair<std::string, std::string>>;

Fingerprint fingerprint(int world_size, const CommSettings& s) {
  return {
      {"world size (WORLD_SIZE / comm_config_t.world_size)", std::to_string(world_size)},
      {"transport (COMM_TRANSPORT / comm_config_t.transport)", s.transport},
      {"timeout (COMM_TIMEOUT_MS / comm_config_t.timeout_ms)", std::to_string(s.timeout_ms)},
      {"tuning profile hash (COMM_TUNING_FILE)", s.tuning_hash},
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

// COMM_TRANSPORT=shm with ranks on other hosts: why it cannot be, naming one such rank.
std::string shm_unavailable(const std::vector<int>& host_of) {
  for (size_t r = 1; r < host_of.size(); ++r)
    if (host_of[r] != host_of[0])
      return "COMM_TRANSPORT=shm needs every rank on one host, but rank " + std::to_string(r) +
             " is on another host than rank 0 (hostname, boot id, network namespace or COMM_HOST_ID differ); "
             "use COMM_TRANSPORT=auto or socket";
  return "";
}

// Rank 0 collects every rank's fingerprint and host and publishes one verdict: the job secret
// and every rank's host (numbered in order of each host's first rank), or why init fails, so
// every rank fails the same way, naming the difference, or none does.
Status agree(Store& store, int rank, int size, const CommSettings& s, std::string* secret, bool* all_local,
             std::vector<int>* host_of) {
  Deadline deadline = Deadline::after_ms(s.timeout_ms);
  Fingerprint mine = fingerprint(size, s);
  const std::string my_host = host_identity();
  COMM_RETURN_IF_ERROR(store.set("init/host/" + std::to_string(rank), my_host));
  COMM_RETURN_IF_ERROR(store.set("init/fp/" + std::to_string(rank), encode(mine)));
  if (rank == 0) {
    std::string problems;
    *all_local = true;
    std::map<std::string, int> hosts = {{my_host, 0}};
    host_of->assign(static_cast<size_t>(size), 0);
    for (int r = 1; r < size; ++r) {
      std::string text, host;
      Status st = store.get("init/fp/" + std::to_string(r), &text, deadline);
      if (st.ok()) st = store.get("init/host/" + std::to_string(r), &host, deadline);
      if (!st.ok())
        return Timeout("rank " + std::to_string(r) + " never joined within " + std::to_string(s.timeout_ms) +
                       " ms (is it running, with the same MASTER_ADDR/MASTER_PORT or init_method?)");
      std::string diff = compare(mine, 0, decode(text), r);
      if (!diff.empty()) problems += (problems.empty() ? "" : "; ") + diff;
      *all_local = *all_local && host == my_host;
      auto [it, added] = hosts.emplace(host, static_cast<int>(hosts.size()));
      (*host_of)[static_cast<size_t>(r)] = it->second;
    }
    COMM_RETURN_IF_ERROR(random_secret(secret));
    const std::string unavailable = s.transport == "shm" && problems.empty() ? shm_unavailable(*host_of) : "";
    std::string verdict = !problems.empty()      ? "FAIL\n" + problems
                          : !unavailable.empty() ? "UNAV\n" + unavailable
                                                 : "OK\n" + *secret + (*all_local ? "L" : "R") + "\n" +
                                                       encode_hosts(*host_of) + "\n" + encode(mine);
    COMM_RETURN_IF_ERROR(store.set("init/verdict", verdict));
    if (!problems.empty() || !unavailable.empty()) {
      // Stay until every rank has read the verdict: our process may hold the store.
      (void)wait_read_by_all(store, "init/verdict", size, deadline);
      if (!unavailable.empty()) return Unavailable(unavailable);
      return InvalidUsage("ranks disagree at init: " + problems + "; start every rank with the same settings");
    }
    return Status::Ok();
  }
  std::string verdict;
  Status st = store.get("init/verdict", &verdict, deadline);
  if (!st.ok()) return Timeout("rank 0 did not finish the init check within " + std::to_string(s.timeout_ms) + " ms");
  (void)confirm_read(store, "init/verdict", rank);
  if (verdict.rfind("FAIL\n", 0) == 0)
    return InvalidUsage("ranks disagree at init: " + verdict.substr(5) + "; start every rank with the same settings");
  if (verdict.rfind("UNAV\n", 0) == 0) return Unavailable(verdict.substr(5));
  size_t nl = verdict.find('\n', 3);
  if (verdict.rfind("OK\n", 0) != 0 || nl == std::string::npos) return Internal("malformed init verdict in the store");
  if (nl < 4) return Internal("malformed init verdict in the store");
  *all_local = verdict[nl - 1] == 'L';
  *secret = verdict.substr(3, nl - 4);
  size_t nl2 = verdict.find('\n', nl + 1);
  if (nl2 == std::string::npos || !decode_hosts(verdict.substr(nl + 1, nl2 - nl - 1), size, host_of))
    return Internal("malformed host map in the init verdict");
  std::string diff = compare(mine, rank, decode(verdict.substr(nl2 + 1)), 0);
  if (!diff.empty())
    return InvalidUsage("ranks disagree at init: " + diff + "; start every rank with the same settings");
  return Status::Ok();
}

// A communicator of one rank has no peers; algorithms only copy locally, so any
// attempt to reach a peer is a bug worth a clear message.
class LoneTransport final : public transport::Transport {
 public:
  explicit LoneTransport(transport::Options o) : Transport(std::move(o)) {}
  const char* name() const override { return "none (1 rank)"; }
  Status isend(int peer, const transport::OpTag&, const void*, size_t, transport::RequestId*) override {
    return Internal("send to rank " + std::to_string(peer) + " in a communicator of one rank");
  }
  Status irecv(int peer, const transport::OpTag&, void*, size_t, transport::RequestId*) override {
    return Internal("receive from rank " + std::to_string(peer) + " in a communicator of one rank");
  }
  Status wait(const transport::RequestId*, size_t n) override {
    return n == 0 ? Status::Ok() : Internal("wait in a communicator of one rank");
  }
  Status test(transport::RequestId, bool* done) override {
    *done = true;
    return Status::Ok();
  }
  void notify_peers(const Status&) override {}
  void abort() override {}
};

bool every_rank_alone(const std::vector<int>& host_of) {
  std::vector<int> seen(host_of.size(), 0);
  for (int h : host_of)
    if (h >= 0 && static_cast<size_t>(h) < seen.size() && seen[static_cast<size_t>(h)]++ > 0) return false;
  return true;
}

// The host transport for ranks on this host and for ranks on other hosts: the topology plan's
// per peer class (same host: shm; other host: ucx on InfiniBand/RoCE hosts, else socket), or the
// forced one (COMM_TRANSPORT / comm_config_t.transport). Every rank decides alike: the plan's
// choices are in the init agreement, the host map is the same everywhere.
struct Choice {
  std::string transport;
  std::string why;
};
void choose(const CommSettings& s, Choice* near, Choice* far) {
  // nccl is about device buffers: host buffers take the plan's transports, as with auto.
  if (s.transport != "auto" && s.transport != "nccl") {
    near->transport = far->transport = s.transport;
    near->why = far->why = "COMM_TRANSPORT / comm_config_t.transport = " + s.transport + " forces it";
    return;
  }
  const topology::Plan& plan = topology::plan_for_process();
  const topology::PeerPlan& local = plan.peer(topology::PeerClass::kSameNuma);
  const topology::PeerPlan& remote = plan.peer(topology::PeerClass::kOtherHost);
  *near = {local.host_transport, "topology plan: " + local.why};
  *far = {remote.host_transport, "topology plan: " + remote.why};
}

Status create_host_transport(const std::string& kind, const transport::Options& opt, comm_t c,
                             std::unique_ptr<transport::Transport>* out) {
  transport::Options o = opt;
  o.store = make_prefix_store(c->job_store, "comm/" + c->id + "/" + kind);
  if (kind == "ucx") return transport::create_ucx_transport(o, out);
  return transport::create_socket_transport(o, out);
}

std::string ranks_where(comm_t c, bool local) {
  std::string out;
  for (int r = 0; r < c->size; ++r)
    if (r != c->rank && (c->host_of[static_cast<size_t>(r)] == c->host_of[static_cast<size_t>(c->rank)]) == local)
      out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

// The profile's transport name for this communicator, decided before it connects (the
// communicator knobs shape the connection): shm (every rank on one host), socket, ucx,
// shm+socket, shm+ucx, socket+ucx -- as connect_transport() builds it.
std::string profile_transport(comm_t c) {
  if (c->settings.transport == "ucx") return "ucx";
  Choice near, far;
  choose(c->settings, &near, &far);
  const std::string remote = far.transport == "ucx" ? "ucx" : "socket";
  if (c->settings.transport == "socket") return "socket";
  if (every_rank_alone(c->host_of)) return remote;
  if (!c->shm_usable) return c->all_local || remote == "socket" ? "socket" : "socket+ucx";
  return c->all_local ? "shm" : "shm+" + remote;
}

// The tuning profile's entries for this communicator, and the INFO lines that say which
// apply, which are ignored (another rank count or transport) or trimmed (environment), and why.
void match_tuning(comm_t c) {
  std::vector<std::string> notes;
  const std::string transport = profile_transport(c);
  c->tuning = tuning::Applied::match(c->size > 1 ? c->settings.profile : nullptr, c->size, transport, &notes);
  if (!c->settings.profile || c->size == 1) return;
  const tuning::Profile& p = *c->settings.profile;
  for (const auto& n : notes) COMM_INFO(kInit, "comm %s rank %d: tuning: %s", c->id.c_str(), c->rank, n.c_str());
  bool host_entries = false;  // NCCL entries act on NCCL's environment, not on this communicator
  for (const auto& e : p.entries) host_entries = host_entries || !e.is_nccl();
  if (!host_entries) return;
  if (c->tuning->call_entries() == 0 && c->tuning->comm_settings().empty() && c->tuning->engine_entries() == 0) {
    COMM_WARN(kInit, "comm %s rank %d: tuning profile %s has no entry for %d ranks over %s; defaults apply "
              "(COMM_DEBUG=INFO lists the entries and why each is ignored)", c->id.c_str(), c->rank, p.path.c_str(),
              c->size, transport.c_str());
    return;
  }
  COMM_INFO(kInit, "comm %s rank %d: tuning profile %s (hash %s): %zu per-call entries and %zu engine entries apply "
            "to %d ranks over %s; communicator settings: %s", c->id.c_str(), c->rank, p.path.c_str(), p.hash.c_str(),
            c->tuning->call_entries(), c->tuning->engine_entries(), c->size, transport.c_str(),
            c->tuning->comm_settings().empty() ? "none" : c->tuning->comm_settings().c_str());
}

// The plan's transports per peer (above), shm falling back to sockets where it cannot be set
// up; COMM_TRANSPORT=shm needs one host. Every rank of the communicator decides alike: the host
// map is the same everywhere and shm's setup outcome is agreed.
Status connect_transport(comm_t c) {
  transport::Options opt;
  opt.rank = c->rank;
  opt.size = c->size;
  opt.timeout_ms = c->settings.timeout_ms;
  opt.secret = c->secret;
  opt.store = make_prefix_store(c->job_store, "comm/" + c->id + "/socket");
  opt.comm_label = "comm " + c->id;
  opt.all_local = c->all_local;
  opt.host_of = c->host_of;
  c->send_seq.assign(static_cast<size_t>(c->size), 0);
  c->recv_seq.assign(static_cast<size_t>(c->size), 0);
  match_tuning(c);
  opt.shm_slot_bytes = c->tuning->shm_slot_bytes();
  opt.socket_nconns = c->tuning->socket_nconns();
  if (c->size == 1) {
    c->transport = std::make_unique<LoneTransport>(opt);
    return Status::Ok();
  }
  Choice near_choice, far_choice;
  choose(c->settings, &near_choice, &far_choice);
  const std::string local_peers = ranks_where(c, true), remote_peers = ranks_where(c, false);
  const bool forced_shm = c->settings.transport == "shm";
  std::unique_ptr<transport::Transport> near;
  if (near_choice.transport == "shm" && c->shm_usable && !every_rank_alone(c->host_of)) {
    transport::Options shm_opt = opt;
    shm_opt.store = make_prefix_store(c->job_store, "comm/" + c->id + "/shm");
    transport::ShmConfig config;
    config.comm_id = c->id;
    config.world_ranks = c->world_ranks;
    config.create_domain = c->id == "0";
    transport::ShmOutcome outcome;
    COMM_RETURN_IF_ERROR(transport::connect_shm(shm_opt, config, &c->shm_domain, &outcome));
    if (!outcome.usable) {
      if (forced_shm) return Unavailable("COMM_TRANSPORT=shm: shared memory could not be set up: " + outcome.why_not);
      COMM_WARN(kNet, "comm %s rank %d: shared memory unavailable (%s); local ranks talk over sockets", c->id.c_str(),
                c->rank, outcome.why_not.c_str());
      c->shm_usable = false;
    }
    near = std::move(outcome.transport);
    if (!near) near_choice = {"socket", "shared memory unavailable: " + outcome.why_not};
  } else if (near_choice.transport == "shm") {
    near_choice = {"socket", c->shm_usable ? "no two ranks share a host" : "shared memory unavailable on some host"};
  }
  if (!local_peers.empty())
    COMM_INFO(kNet, "comm %s rank %d: ranks on this host (%s) -> %s (%s)", c->id.c_str(), c->rank, local_peers.c_str(),
              near ? near->name() : near_choice.transport.c_str(), near_choice.why.c_str());
  if (!remote_peers.empty())
    COMM_INFO(kNet, "comm %s rank %d: ranks on other hosts (%s) -> %s (%s)", c->id.c_str(), c->rank,
              remote_peers.c_str(), far_choice.transport.c_str(), far_choice.why.c_str());
  if (near && c->all_local) {
    c->transport = std::move(near);
    return Status::Ok();
  }
  // One transport reaches every peer when nothing local is special (or local and remote agree).
  const std::string& far_kind = c->all_local ? near_choice.transport : far_choice.transport;
  std::unique_ptr<transport::Transport> far;
  COMM_RETURN_IF_ERROR(create_host_transport(far_kind, opt, c, &far));
  if (!near && (near_choice.transport != far_kind && !local_peers.empty() && !remote_peers.empty())) {
    // Local ranks on another transport than remote ones (e.g. sockets inside, UCX between).
    COMM_RETURN_IF_ERROR(create_host_transport(near_choice.transport, opt, c, &near));
  }
  if (!near) {
    c->transport = std::move(far);
    return Status::Ok();
  }
  std::vector<bool> is_local(static_cast<size_t>(c->size));
  for (int r = 0; r < c->size; ++r)
    is_local[static_cast<size_t>(r)] = c->host_of[static_cast<size_t>(r)] == c->host_of[static_cast<size_t>(c->rank)];
  c->transport = transport::make_routed_transport(opt, std::move(near), std::move(far), std::move(is_local));
  return Status::Ok();
}

// init returns only once every rank is connected, so nobody tears the store down early.
Status init_barrier(comm_t c) {
  if (c->size == 1) return Status::Ok();
  algo::CollArgs args;
  args.kind = transport::CollKind::kBarrier;
  stamp(c, &args);
  args.tag.coll = transport::CollKind::kInternal;
  return execute(c, args);
}

}  // namespace

Status init_communicator(const comm_config_t& cfg, comm_t* out) {
  auto c = std::make_unique<comm_s>();
  COMM_RETURN_IF_ERROR(resolve_settings(cfg, &c->settings));
  Identity id;
  COMM_RETURN_IF_ERROR(resolve_identity(cfg, &id));
  c->rank = id.rank;
  c->size = id.world_size;
  c->id = "0";
  log::set_thread_rank(c->rank);
  std::string token;
  COMM_RETURN_IF_ERROR(params::get_string("COMM_AUTH_TOKEN", &token));
  COMM_RETURN_IF_ERROR(open_store(id, c->settings.timeout_ms, token, &c->job_store));
  // Once per process: plan, NCCL_* env (the profile's over the plan's); never fails.
  std::vector<std::string> nccl_notes;
  const auto nccl = tuning::nccl_settings(c->settings.profile.get(), c->size, &nccl_notes);
  for (const auto& n : nccl_notes) COMM_INFO(kEnv, "rank %d: tuning: %s", c->rank, n.c_str());
  topology::prepare_process(c->job_store.get(), nccl);
  COMM_RETURN_IF_ERROR(
      agree(*c->job_store, c->rank, c->size, c->settings, &c->secret, &c->all_local, &c->host_of));
  c->world_ranks.resize(static_cast<size_t>(c->size));
  for (int r = 0; r < c->size; ++r) c->world_ranks[static_cast<size_t>(r)] = r;
  COMM_RETURN_IF_ERROR(connect_transport(c.get()));
  COMM_RETURN_IF_ERROR(init_barrier(c.get()));
  // Asked for NCCL: made now, so a job that cannot have it fails here, on every rank, saying why.
  if (c->settings.transport == "nccl") COMM_RETURN_IF_ERROR(device::init_forced(c.get()));
  COMM_INFO(kInit, "rank %d of %d ready (init %s, transport %s, timeout %d ms)", c->rank, c->size,
            id.init_method.c_str(), c->transport->name(), c->settings.timeout_ms);
  *out = c.release();
  return Status::Ok();
}

Status create_child(comm_t parent, const std::string& id, int rank, const std::vector<int>& members, comm_t* out) {
  auto c = std::make_unique<comm_s>();
  c->rank = rank;
  c->size = static_cast<int>(members.size());
  c->id = id;
  c->settings = parent->settings;
  c->secret = parent->secret;
  c->job_store = parent->job_store;
  c->shm_domain = parent->shm_domain;
  c->shm_usable = parent->shm_usable;
  // Hosts renumbered in order of each host's first member, as the world's are.
  std::map<int, int> renumber;
  for (int p : members) {
    const int h = parent->host_of[static_cast<size_t>(p)];
    renumber.emplace(h, static_cast<int>(renumber.size()));
    c->host_of.push_back(renumber[h]);
    c->world_ranks.push_back(parent->world_ranks[static_cast<size_t>(p)]);
  }
  c->all_local = renumber.size() == 1;
  COMM_RETURN_IF_ERROR(connect_transport(c.get()));
  COMM_RETURN_IF_ERROR(init_barrier(c.get()));
  COMM_INFO(kInit, "comm %s: rank %d of %d ready (transport %s)", id.c_str(), rank, c->size, c->transport->name());
  *out = c.release();
  return Status::Ok();
}

void destroy_communicator(comm_t c) {
  {
    std::lock_guard<std::mutex> lock(c->queue_mu);
    c->worker_stop = true;
  }
  c->queue_cv.notify_all();
  if (c->worker.joinable()) c->worker.join();  // drains: every queued call is bounded by the timeout
  for (auto* r : c->free_requests) delete r;
  device::release(c);  // before the transport: a graceful NCCL finalize may still need peers
  c->transport.reset();
  delete c;
}

}  // namespace comm

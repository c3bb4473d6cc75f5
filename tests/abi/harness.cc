#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include "harness.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include <catch2/catch.hpp>

namespace abi {

std::string unique_init_method(const std::string& what) {
  static std::atomic<int> sequence{0};
  return "memory://abi-" + what + "-" + std::to_string(getpid()) + "-" + std::to_string(sequence++);
}

comm_config_t make_config(const std::string& init_method, int rank, int world_size, int timeout_ms) {
  comm_config_t cfg = COMM_CONFIG_INIT;
  cfg.init_method = init_method.c_str();
  cfg.rank = rank;
  cfg.world_size = world_size;
  cfg.timeout_ms = timeout_ms;
  return cfg;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string status_name(comm_status_t s) {
  switch (s) {
    case COMM_OK: return "COMM_OK";
    case COMM_ERR_INVALID_ARGUMENT: return "COMM_ERR_INVALID_ARGUMENT";
    case COMM_ERR_INVALID_USAGE: return "COMM_ERR_INVALID_USAGE";
    case COMM_ERR_SYSTEM: return "COMM_ERR_SYSTEM";
    case COMM_ERR_TIMEOUT: return "COMM_ERR_TIMEOUT";
    case COMM_ERR_REMOTE: return "COMM_ERR_REMOTE";
    case COMM_ERR_ABORTED: return "COMM_ERR_ABORTED";
    case COMM_ERR_UNAVAILABLE: return "COMM_ERR_UNAVAILABLE";
    case COMM_ERR_INTERNAL: return "COMM_ERR_INTERNAL";
  }
  return "status " + std::to_string(static_cast<int>(s));
}

bool icontains(const std::string& haystack, const std::string& needle) {
  auto lower = [](std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  return lower(haystack).find(lower(needle)) != std::string::npos;
}

std::string last_error(comm_t comm) {
  const char* m = comm_last_error(comm);
  return m ? std::string(m) : std::string("(null)");
}

Reduced allreduce_sum(comm_t c, int64_t value) {
  Reduced out;
  int64_t v = value;
  out.status = comm_allreduce(c, &v, &out.sum, 1, COMM_INT64, COMM_SUM, nullptr);
  if (out.status != COMM_OK) out.message = last_error(c);
  return out;
}

std::string describe(const Outcome& o) {
  return status_name(o.status) + " after " + std::to_string(static_cast<long>(o.ms)) + " ms" +
         (o.message.empty() ? "" : ": " + o.message);
}

bool Ranks::all_ok() const {
  return std::all_of(outcomes.begin(), outcomes.end(), [](const Outcome& o) { return o.status == COMM_OK; });
}

std::string Ranks::describe() const {
  std::string s;
  for (size_t r = 0; r < outcomes.size(); ++r) s += "rank " + std::to_string(r) + ": " + abi::describe(outcomes[r]) + "\n";
  return s;
}

Ranks init_ranks(int n, const std::string& what, int timeout_ms, const ConfigTweak& tweak) {
  const std::string method = unique_init_method(what);
  Ranks out;
  out.comms.assign(static_cast<size_t>(n), nullptr);
  out.outcomes = on_ranks(n, [&](int r) {
    comm_config_t cfg = make_config(method, r, n, timeout_ms);
    if (tweak) tweak(r, cfg);
    comm_t c = nullptr;
    Outcome o = timed(nullptr, [&] { return comm_init(&cfg, &c); });
    out.comms[static_cast<size_t>(r)] = o.status == COMM_OK ? c : nullptr;
    return o;
  });
  return out;
}

void destroy_ranks(std::vector<comm_t>& comms) {
  on_ranks(static_cast<int>(comms.size()), [&](int r) {
    auto& c = comms[static_cast<size_t>(r)];
    if (c) comm_destroy(c);
    c = nullptr;
  });
}

void Failures::add(const std::string& what) {
  if (count_++ < 12) {
    std::lock_guard<std::mutex> lock(mu_);
    first_.push_back(what);
  }
}

std::string Failures::summary(size_t max_lines) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string s;
  for (size_t i = 0; i < first_.size() && i < max_lines; ++i) s += first_[i] + "\n";
  if (count_ > first_.size()) s += "... " + std::to_string(count_ - first_.size()) + " more failures\n";
  return s;
}

// ---- shared worlds and buffers ----

namespace {

struct SharedWorlds {
  std::mutex mu;
  std::map<int, std::vector<comm_t>> worlds;
  std::map<int, bool> broken;
  ~SharedWorlds() = default;
};

SharedWorlds& worlds() {
  static SharedWorlds* w = new SharedWorlds;  // destroyed explicitly by the listener below
  return *w;
}

}  // namespace

void destroy_shared_worlds() {
  auto& w = worlds();
  std::lock_guard<std::mutex> lock(w.mu);
  for (auto& [n, comms] : w.worlds) destroy_ranks(comms);
  w.worlds.clear();
}

namespace {

unsigned char* slot(int which, int rank) {
  static std::unique_ptr<unsigned char[]> slots[2][kMaxRanks];
  static std::once_flag once[2][kMaxRanks];
  std::call_once(once[which][rank], [&] {
    slots[which][rank].reset(new unsigned char[kSlotBytes]);
    std::memset(slots[which][rank].get(), 0, kSlotBytes);  // touch once, here, not in a timed call
  });
  return slots[which][rank].get();
}

}  // namespace

}  // namespace abi

namespace {
// Shared communicators are destroyed while the process and the library are still whole.
struct SharedWorldTeardown : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunEnded(const Catch::TestRunStats&) override { abi::destroy_shared_worlds(); }
};
}  // namespace
CATCH_REGISTER_LISTENER(SharedWorldTeardown)

namespace abi {

std::vector<comm_t>& shared_world(int n) {
  auto& w = worlds();
  std::lock_guard<std::mutex> lock(w.mu);
  auto it = w.worlds.find(n);
  if (it != w.worlds.end() && w.broken[n]) {
    // Aborting first makes destroy immediate on a world that failed mid-collective.
    for (auto c : it->second) {
      if (c) comm_abort(c);
    }
    destroy_ranks(it->second);
    w.worlds.erase(it);
    it = w.worlds.end();
  }
  if (it == w.worlds.end()) {
    Ranks ranks = init_ranks(n, "shared" + std::to_string(n), 60000);
    if (!ranks.all_ok()) {
      destroy_ranks(ranks.comms);
      FAIL("comm_init of the shared " << n << "-rank world failed:\n" << ranks.describe());
    }
    w.broken[n] = false;
    it = w.worlds.emplace(n, ranks.comms).first;
  }
  return it->second;
}

void mark_shared_world_broken(int n) {
  auto& w = worlds();
  std::lock_guard<std::mutex> lock(w.mu);
  w.broken[n] = true;
}

unsigned char* send_slot(int rank) { return slot(0, rank); }
unsigned char* recv_slot(int rank) { return slot(1, rank); }

struct Step {
  explicit Step(int n) : barrier(n) {}
  std::barrier<> barrier;
  std::atomic<bool> broken{false};
  Failures failures;
};

unsigned char* RankCtx::recv_of(int r) const { return recv_slot(r); }
unsigned char* RankCtx::send_of(int r) const { return send_slot(r); }

void RankCtx::fail(const std::string& what) { step->failures.add("rank " + std::to_string(rank) + ": " + what); }

bool RankCtx::settle(comm_status_t st, const std::string& what, const std::function<void()>& verify) {
  if (st != COMM_OK) {
    fail(what + ": returned " + status_name(st) + ": " + last_error(comm));
    step->broken = true;
  }
  step->barrier.arrive_and_wait();
  if (!step->broken) verify();
  step->barrier.arrive_and_wait();
  return !step->broken;
}

std::string run_on_shared_world(int n, const std::function<void(RankCtx&)>& body) {
  std::vector<comm_t>& comms = shared_world(n);
  for (int r = 0; r < n; ++r) {
    send_slot(r);
    recv_slot(r);
  }
  Step step(n);
  on_ranks(n, [&](int r) {
    RankCtx ctx;
    ctx.rank = r;
    ctx.n = n;
    ctx.comm = comms[static_cast<size_t>(r)];
    ctx.send = send_slot(r);
    ctx.recv = recv_slot(r);
    ctx.step = &step;
    body(ctx);
  });
  if (step.broken) mark_shared_world_broken(n);
  return step.failures.summary();
}

}  // namespace abi

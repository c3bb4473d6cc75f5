#include "support/shm_fabric.h"

#include <sys/random.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "store/store.h"
#include "routed/routed_transport.h"
#include "shm/shm_transport.h"
#include "socket/socket_transport.h"
#include "ucx/ucx_transport.h"

namespace comm::testing {

std::vector<int> one_host(int n) { return std::vector<int>(static_cast<size_t>(n), 0); }

std::vector<int> two_hosts(int n) {
  std::vector<int> h(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) h[static_cast<size_t>(r)] = r % 2;
  return h;
}

namespace {

Status make_one(const std::string& kind, const transport::Options& opt, const std::shared_ptr<Store>& store,
                std::unique_ptr<transport::Transport>* out) {
  transport::Options o = opt;
  o.store = make_prefix_store(store, kind);
  if (kind == "ucx") return transport::create_ucx_transport(o, out);
  return transport::create_socket_transport(o, out);
}

}  // namespace

Status make_real_transports(const std::vector<int>& host_of, int timeout_ms,
                            std::vector<std::unique_ptr<transport::Transport>>* out, const std::string& near_kind,
                            const std::string& far_kind, int heartbeat_ms) {
  static std::atomic<int> sequence{0};
  const int n = static_cast<int>(host_of.size());
  const std::string name = "shm-fabric-" + std::to_string(getpid()) + "-" + std::to_string(sequence++);
  auto store = memory_store(name);
  unsigned char bytes[8] = {};
  if (getrandom(bytes, sizeof bytes, 0) != sizeof bytes) return SystemError("getrandom failed");
  std::string secret;
  for (unsigned char b : bytes) {
    secret.push_back("0123456789abcdef"[b >> 4]);
    secret.push_back("0123456789abcdef"[b & 15]);
  }
  bool one = true;
  for (int h : host_of) one = one && h == host_of[0];

  out->clear();
  out->resize(static_cast<size_t>(n));
  std::vector<Status> status(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      transport::Options opt;
      opt.rank = r;
      opt.size = n;
      opt.timeout_ms = timeout_ms;
      opt.heartbeat_ms = heartbeat_ms;
      opt.secret = secret;
      opt.comm_label = "test";
      opt.all_local = true;  // one network namespace: sockets over loopback
      opt.host_of = host_of;
      Status& st = status[static_cast<size_t>(r)];
      auto& t = (*out)[static_cast<size_t>(r)];
      std::unique_ptr<transport::Transport> near;
      if (near_kind == "shm") {
        transport::Options shm_opt = opt;
        shm_opt.store = make_prefix_store(store, "shm");
        transport::ShmConfig config;
        config.comm_id = name;
        config.create_domain = true;
        std::shared_ptr<transport::shm::Domain> domain;
        transport::ShmOutcome outcome;
        st = transport::connect_shm(shm_opt, config, &domain, &outcome);
        if (st.ok() && !outcome.usable) st = Unavailable("shared memory unusable: " + outcome.why_not);
        if (!st.ok()) return;
        near = std::move(outcome.transport);
      } else if (one || near_kind != far_kind) {
        st = make_one(near_kind, opt, store, &near);
        if (!st.ok()) return;
      }
      if (one) {
        t = std::move(near);
        return;
      }
      std::unique_ptr<transport::Transport> far;
      st = make_one(far_kind, opt, store, &far);
      if (!st.ok()) return;
      if (!near) {
        t = std::move(far);
        return;
      }
      std::vector<bool> local(static_cast<size_t>(n));
      for (int p = 0; p < n; ++p) local[static_cast<size_t>(p)] = host_of[static_cast<size_t>(p)] == host_of[static_cast<size_t>(r)];
      t = transport::make_routed_transport(opt, std::move(near), std::move(far), std::move(local));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    if (!status[static_cast<size_t>(r)].ok()) return status[static_cast<size_t>(r)].prefixed("rank " + std::to_string(r) + ": ");
  return Status::Ok();
}

}  // namespace comm::testing

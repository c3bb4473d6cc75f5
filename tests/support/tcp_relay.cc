#include "support/tcp_relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>

namespace comm::testing {
namespace {

bool send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

}  // namespace

TcpRelay::TcpRelay(const sockaddr* target, socklen_t target_len) : target_len_(target_len) {
  std::memcpy(&target_, target, target_len);
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(listen_fd_ >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(listen_fd_, 64) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  port_ = ntohs(a.sin_port);
  thread_ = std::thread([this] { run(); });
}

TcpRelay::~TcpRelay() {
  stop_.store(true);
  thread_.join();
  ::close(listen_fd_);
}

std::string TcpRelay::captured() const {
  std::lock_guard<std::mutex> lock(mu_);
  return captured_;
}

std::vector<std::string> TcpRelay::client_streams() const {
  std::lock_guard<std::mutex> lock(mu_);
  return client_streams_;
}

int TcpRelay::connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(client_streams_.size());
}

void TcpRelay::run() {
  struct Pair {
    int client, server;
    size_t stream;  // index into client_streams_
    bool held = false;  // its first TLS answer was held (hold_first_tls_answer)
  };
  std::vector<Pair> pairs;
  std::vector<pollfd> fds;
  char buf[64 * 1024];
  while (!stop_.load()) {
    fds.clear();
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const auto& p : pairs) {
      fds.push_back({p.client, POLLIN, 0});
      fds.push_back({p.server, POLLIN, 0});
    }
    if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
    for (size_t i = 0; i < pairs.size(); ++i) {
      for (int side = 0; side < 2; ++side) {
        Pair& p = pairs[i];
        if (p.client < 0 || (fds[1 + 2 * i + side].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        const int from = side == 0 ? p.client : p.server;
        const int to = side == 0 ? p.server : p.client;
        ssize_t n = ::recv(from, buf, sizeof buf, 0);
        if (n > 0) {
          if (side == 1 && !p.held && n >= 2 && buf[0] == 0x16 && buf[1] == 0x03 && hold_ms_.load() > 0) {
            p.held = true;
            std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms_.load()));
          }
          {
            std::lock_guard<std::mutex> lock(mu_);
            captured_.append(buf, static_cast<size_t>(n));
            if (side == 0) client_streams_[p.stream].append(buf, static_cast<size_t>(n));
          }
          if (send_all(to, buf, static_cast<size_t>(n))) continue;
        }
        // One side ended: end the other, as a real connection would.
        ::close(p.client);
        ::close(p.server);
        p.client = p.server = -1;
      }
    }
    std::erase_if(pairs, [](const Pair& p) { return p.client < 0; });
    if (fds[0].revents & POLLIN) {
      int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      int s = ::socket(target_.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (s < 0 || ::connect(s, reinterpret_cast<const sockaddr*>(&target_), target_len_) != 0) {
        if (s >= 0) ::close(s);
        ::close(c);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      client_streams_.emplace_back();
      pairs.push_back({c, s, client_streams_.size() - 1});
    }
  }
  for (const auto& p : pairs) {
    ::close(p.client);
    ::close(p.server);
  }
}

}  // namespace comm::testing

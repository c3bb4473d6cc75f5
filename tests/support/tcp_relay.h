// A TCP forwarder for tests that must see what goes on the wire: it listens on 127.0.0.1,
// relays every connection made to it to one target address, and records every byte both ways.
// Real sockets, no mock: the two ends cannot tell it from the network.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace comm::testing {

class TcpRelay {
 public:
  // target: where each relayed connection goes (any family). REQUIREs that it can listen.
  TcpRelay(const sockaddr* target, socklen_t target_len);
  ~TcpRelay();
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  int port() const { return port_; }
  // Every byte relayed so far, both directions, in the order it was read.
  std::string captured() const;
  // What the clients sent, one string per relayed connection, in the order they were accepted.
  std::vector<std::string> client_streams() const;
  int connections() const;
  // From now on, the first TLS record the target sends on each connection (a read that starts
  // with a TLS handshake record, 0x16 0x03) is held `ms` before it is relayed: a rank 0 slow to
  // answer a ClientHello, as a busy one is. The relay's thread waits meanwhile.
  void hold_first_tls_answer(int ms) { hold_ms_.store(ms); }

 private:
  void run();

  sockaddr_storage target_{};
  socklen_t target_len_ = 0;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> hold_ms_{0};
  mutable std::mutex mu_;
  std::string captured_;
  std::vector<std::string> client_streams_;
  std::thread thread_;
};

}  // namespace comm::testing

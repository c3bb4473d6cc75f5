// Setting up the socket transport's full mesh: every rank listens, publishes "addr/<rank>"
// in the store, connects `nconns` times to every lower rank and accepts from every higher
// one. Each connection presents {magic, version, secret, rank, index}; the acceptor checks
// it and replies. Strangers and garbage are dropped with a log line; accepting goes on until
// every expected peer is in, bounded by the timeout.
#pragma once

#include <string>
#include <vector>

#include "store/store.h"
#include "socket/net.h"

namespace comm::transport::sock {

struct MeshConfig {
  int rank = 0;
  int size = 1;
  int nconns = 1;
  int timeout_ms = 0;
  std::string secret;
  std::string label;  // for log lines
  Store* store = nullptr;
  std::string host;  // numeric address of the chosen interface
  int family = 0;
};

struct MeshLink {
  Fd fd;               // connected, non-blocking, CLOEXEC, TCP_NODELAY
  std::string remote;  // "192.0.2.2:41234", for messages
};

// On success (*links)[peer * nconns + index] holds every connection (entries for this rank
// stay empty). The listener is closed before returning.
Status build_mesh(const MeshConfig& config, std::vector<MeshLink>* links);

}  // namespace comm::transport::sock

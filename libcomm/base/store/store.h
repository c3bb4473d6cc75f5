// The key-value store the rendezvous runs on (PyTorch's c10d Store model).
// Rank 0 serves it over TCP; in-process ranks (tests) share a MemoryStore.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "deadline.h"
#include "status.h"

namespace comm::tls {
class Context;  // tls/tls.h
}

namespace comm {

class Store {
 public:
  virtual ~Store() = default;
  virtual Status set(const std::string& key, const std::string& value) = 0;
  // The same, bounded by `deadline` where the store can block (a TCP store whose server may be
  // stopped); the others ignore it.
  virtual Status set(const std::string& key, const std::string& value, Deadline deadline) {
    (void)deadline;
    return set(key, value);
  }
  // Blocks until key exists or the deadline passes (COMM_ERR_TIMEOUT naming the key).
  virtual Status get(const std::string& key, std::string* value, Deadline deadline) = 0;
  // Atomically adds delta to the integer stored at key (0 when absent); returns the new value.
  virtual Status add(const std::string& key, int64_t delta, int64_t* result) = 0;
  // Closes connections kept open for the next request (the TCP client's); the next request
  // opens one again. A communicator calls it when its init is done: rank 0's store then holds
  // no connection per rank for the job's life (docs/design/base.md, "The store's connections").
  virtual void release_idle() {}
  // The TCP store: true (its server lives in world rank 0's process and dies with it). The
  // others outlive any rank. comm_shrink asks, to know whether survivors can still meet here.
  virtual bool dies_with_rank0() const { return false; }
  // An address of this process's host that the store's server reached it by (the TCP client:
  // its end of the connection; the server: the host it was told to listen on), "" when
  // unknown. Published at init, so survivors can meet at another rank's host when rank 0 is
  // gone (comm_shrink; docs/design/core.md, "Shrinking a communicator").
  virtual std::string reach_address() const { return ""; }
};

// Read receipts for an answer rank 0 publishes at `key` (read_receipts.cc): each other rank
// confirms once it has read it; rank 0, which serves the store and may exit next, waits for
// ranks 1..size-1 (a failure names the first rank that did not confirm).
Status confirm_read(Store& store, const std::string& key, int rank);
Status wait_read_by_all(Store& store, const std::string& key, int size, Deadline deadline);
// The same for the given ranks only (the ranks that took part in an agreement).
Status wait_read_by(Store& store, const std::string& key, const std::vector<int>& ranks, Deadline deadline);

// Every key gets "prefix/" in front: one store serves many communicators.
std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> base, const std::string& prefix);

// A get that would block checks `check` every slice_ms of its wait and returns its error as soon
// as it has one (watched_store.cc): a wait for a rank known dead ends then, not at the deadline.
std::shared_ptr<Store> make_watched_store(std::shared_ptr<Store> base, std::function<Status()> check, int slice_ms);

// In-process store shared by ranks that are threads of one process. Stores with the same
// name are the same store while any handle to it lives ("memory://NAME").
std::shared_ptr<Store> memory_store(const std::string& name);

struct TcpStoreOptions {
  std::string host;           // address rank 0 listens on / others connect to
  int port = 0;               // 0: rank 0 picks one (tests)
  bool is_server = false;     // rank 0 serves
  // The server runs outside the job's ranks (comm-run --replace-failed, torchrun's agent): a
  // client's dies_with_rank0() is false.
  bool external = false;
  int world_size = 1;
  int timeout_ms = 600000;    // connect retry with backoff until this passes
  std::string auth_token;     // COMM_AUTH_TOKEN: clients presenting another are refused, logged
  // Server: a connection must say hello within this, and at most this many may wait to: the
  // oldest is closed for a new one, so idle connections cannot use up rank 0's descriptors.
  int hello_timeout_ms = 5000;
  int max_unauthenticated = 64;
  // COMM_TLS: every connection runs TLS 1.3 in this context after its hello (tls/tls.h; the key
  // from COMM_AUTH_TOKEN, or certificates); null: plaintext. Server and clients must agree.
  std::shared_ptr<tls::Context> tls;
};
// Rank 0: binds (COMM_ERR_SYSTEM naming the port if in use) and serves on a thread.
// Others: connect with retry and exponential backoff until timeout (COMM_ERR_TIMEOUT naming
// host:port). A client sending garbage is dropped with a log line; the server goes on.
Status make_tcp_store(const TcpStoreOptions& options, std::shared_ptr<Store>* out);
int tcp_store_port(const Store& store);  // the port a server store listens on (tests), else -1

// file:///PATH: a shared-filesystem store (one file per key, atomic rename), for jobs
// with no reachable rank 0 address.
Status make_file_store(const std::string& dir, std::shared_ptr<Store>* out);

}  // namespace comm

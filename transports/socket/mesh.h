// The socket transport's connections, made when a peer is first needed (docs/design/transports.md,
// "Connections"). Every rank listens for the job's life, on each address of its chosen
// interfaces (docs/topology.md, "Messy networks"), and publishes them all as "addr/<rank>"; rank 0
// gathers the addresses into one table ("addrs") that every rank reads once, so the store
// answers n reads, not n^2 (the world's comes in the init verdict instead, with a listener the
// core made before it: adopt()). A rank that needs a peer dials its `nconns` connections; each
// connection presents {magic, version, rank, index, the rank it dials}, proves the job secret by
// challenge-response (socket/wire.h, crypto/proof.h: the secret never goes on the wire), and
// the acceptor checks it all, proves the secret back and replies. Both ranks of a pair may dial at once: per connection index the dial of the
// higher rank wins (the lower one is answered kYield and waits for the higher one's dial),
// so exactly one connection per index survives and neither side waits for the other.
// A dial tries the peer's addresses Happy-Eyeballs style (mesh_dial.cc): staggered, in parallel,
// an address that fails for sure or whose TCP handshake goes unanswered is a miss, and only a
// peer none of whose addresses works fails, naming each address and its error.
// Strangers and garbage are dropped with a log line. COMM_SOCKET_EAGER=1 connects every
// pair at setup (the higher rank dials), as before lazy connections.
#pragma once

#include <poll.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "deadline.h"
#include "params.h"
#include "store/store.h"
#include "posix/endpoints.h"
#include "socket/net.h"
#include "tls/tls.h"

namespace comm::transport {
class Arrivals;  // common/arrivals.h
}

namespace comm::transport::sock {

struct MeshConfig {
  int rank = 0;
  int size = 1;
  int nconns = 1;
  int timeout_ms = 0;
  std::string secret;
  std::string label;  // for log lines
  Store* store = nullptr;
  std::vector<posix::LocalAddress> listen;  // where to listen, in order of preference
  std::vector<int> host_of;  // every rank's host number (the proofs bind it); empty: all 0
  // COMM_SOCKET_CONNECT_TIMEOUT_MS: one address's TCP handshake
  int connect_timeout_ms = params::kSocketConnectTimeoutDefaultMs;
  std::string route_ifname;  // the interface that reaches the store's host, for a failure's fix
  // COMM_TLS: after the handshake every connection runs TLS 1.3 (mesh_tls.cc); null: plaintext.
  std::shared_ptr<tls::Context> tls;
  // Straggler detection's per-peer counters (common/arrivals.h): a failed dial retried counts as
  // a reconnect of that peer. Null: not counted.
  std::shared_ptr<Arrivals> arrivals;
};

struct MeshLink {
  int peer = -1;
  int index = 0;
  Fd fd;               // connected, non-blocking, CLOEXEC, TCP_NODELAY
  std::string remote;  // "192.0.2.2:41234", for messages
  std::unique_ptr<tls::Session> tls;  // COMM_TLS: every byte goes through it
};

// A connection whose libcomm handshake succeeded and whose TLS handshake runs (mesh_tls.cc).
struct TlsPending {
  std::unique_ptr<tls::Session> session;  // null: no TLS handshake under way
  short events = POLLIN;                  // what the handshake waits for
  std::string why;                        // kFailed: what went wrong
  bool handshaken = false;  // connector: the handshake is done, the acceptor's kTlsReady is read
  uint64_t ready = 0;       // connector: kTlsReady as it arrives
  size_t ready_got = 0;
};

// A peer that cannot be connected: every connection to it fails with `reason` ("refused the
// connection at ..."); `is_exit` when it looks gone (nothing listens at its address).
struct MeshFailure {
  int peer = -1;
  std::string reason;
  bool is_exit = false;
  bool unreachable = false;  // no address of the peer leads to it from here: a network error
};

class Mesh {
 public:
  explicit Mesh(MeshConfig config);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  // Listens, publishes this rank's address, reads the table. A rank that cannot listen
  // publishes why, so every rank fails at once naming it instead of waiting for its address.
  Status start();
  // start() for the world at init: the listeners the core made before the verdict and the
  // table that came in it (transport.h, EarlyListener), so the store is not read again.
  Status adopt(std::vector<Fd> listeners, std::vector<std::string> table);
  // Eager mode: every connection of this rank, before returning (bounded by the timeout).
  Status connect_all(std::vector<MeshLink>* done);

  // Starts dialing connections 0..count-1 to peer that are neither up nor under way. A small
  // message needs connection 0 only; a striped one all: latency-only peers cost one descriptor.
  void want(int peer, int count);
  // Appends the listener, handshakes and dials to poll; lowers *wake to the next retry.
  void add_polls(std::vector<pollfd>* pfds, Clock::time_point* wake);
  // Handles the revents of the n entries add_polls appended (at pfds); finished connections go
  // to done, peers that cannot be connected to failed. An error fails the transport (out of
  // file descriptors; a peer of another world size).
  Status on_poll(const pollfd* pfds, size_t n, std::vector<MeshLink>* done, std::vector<MeshFailure>* failed);
  // Dials whose retry time passed (with no poll event), and dials past their deadline.
  void on_time(std::vector<MeshFailure>* failed);

  // A failed transport takes no new connections: late dialers are refused and fail at once.
  void stop_listening();
  // For a timeout's message: what is known about a peer not connected yet.
  std::string why_not_connected(int peer) const;

  const std::string& listen_address() const { return listen_text_; }
  size_t connected() const { return connected_; }

 private:
  struct Outgoing;
  struct Incoming;
  Status read_table();
  Status give_up_table(Status why);
  Status accept_all();
  Status on_incoming(Incoming& in, std::vector<MeshLink>* done);
  Status validate(Incoming& in, std::vector<MeshLink>* done);
  Status tls_accepted(Incoming& in, std::vector<MeshLink>* done);
  Status tls_connected(Outgoing& o, std::vector<MeshLink>* done);
  bool challenge(Incoming& in);
  bool reply(Incoming& in, uint32_t code, uint32_t value, const uint8_t* extra = nullptr, size_t extra_bytes = 0);
  void drop(Incoming& in, const std::string& why, bool quiet = false);
  Status start_connect(Outgoing& o, std::vector<MeshFailure>* failed);
  Status on_outgoing(Outgoing& o, std::vector<MeshLink>* done, std::vector<MeshFailure>* failed);
  Status refused(const Outgoing& o);
  void retry(Outgoing& o, const std::string& why);
  void give_up(Outgoing& o, const std::string& reason, bool is_exit, std::vector<MeshFailure>* failed);
  // mesh_dial.cc: an address that does not lead to the peer; the peer fails once all have.
  void miss(Outgoing& o, const std::string& why, std::vector<MeshFailure>* failed, bool refusal = false);
  void linked_by(const Outgoing& winner);  // the slot is up: its other attempts end
  bool sibling_alive(const Outgoing& o) const;
  std::string unreachable_text(int peer, int index) const;
  std::string describe(const Outgoing& o) const;
  std::string addresses_of(int peer, int index) const;
  std::string attempts_text(int peer) const;
  void note_path(const Outgoing& o, bool works, const std::string& why) const;
  std::string context_for(int rank) const;
  std::string me() const;
  // mesh_tls.cc: starting and stepping a TLS handshake after the libcomm one.
  enum class TlsStep { kWaiting, kDone, kFailed };
  Status tls_start(TlsPending* t, int fd, bool client);
  TlsStep tls_step(TlsPending* t);
  std::string tls_refusal(int peer, const std::string& where, const std::string& why) const;
  size_t slot(int peer, int index) const {
    return static_cast<size_t>(peer) * static_cast<size_t>(c_.nconns) + static_cast<size_t>(index);
  }

  const MeshConfig c_;
  std::vector<Fd> listeners_;
  std::string listen_text_;
  std::vector<std::string> addrs_;  // every rank's listening address, from the table
  std::vector<uint8_t> linked_;     // per connection slot: up
  std::vector<Incoming> incoming_;
  std::vector<Outgoing> outgoing_;
  size_t connected_ = 0;
  Status fatal_;  // out of file descriptors: the transport fails with it
};

}  // namespace comm::transport::sock

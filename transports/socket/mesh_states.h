// The mesh's handshakes in progress, shared by mesh.cc (the libcomm handshake) and mesh_tls.cc
// (the TLS handshake that follows it under COMM_TLS). Private to those two files.
#pragma once

#include "socket/mesh.h"
#include "socket/wire.h"

namespace comm::transport::sock {

inline constexpr size_t kMaxPendingAccepts = 64;  // half-open strangers we keep before shedding the oldest
inline constexpr int kFirstBackoffMs = 10;
inline constexpr int kMaxBackoffMs = 500;
// Refused this often: nothing listens at the peer's address. Listeners stay open for the job's
// life and are published only once listening, so the peer is gone; a few tries ride out a
// transient, then the caller fails now instead of at its timeout.
inline constexpr int kRefusalsMeanGone = 3;

// Per connection slot (linked_).
inline constexpr uint8_t kNotLinked = 0;
inline constexpr uint8_t kLinked = 1;
inline constexpr uint8_t kPeerDials = 2;  // our dial was answered kYield: the peer's arrives

// Happy Eyeballs (RFC 8305): the next address of a peer is dialed this long after the one
// before it, unless that one fails sooner (then at once).
inline constexpr int kStaggerMs = 250;

// kMissed: this address does not lead to the peer (mesh_dial.cc); kept, with its error, until
// the connection is up through another address or every address has missed.
enum class OutState { kWaitRetry, kConnecting, kSendHello, kAwaitReply, kTls, kMissed, kDone };

// One attempt at one connection (peer, index) through one of the peer's addresses; a
// connection has one attempt per address, staggered.
struct Mesh::Outgoing {
  int peer = 0;
  int index = 0;
  SockAddr addr;
  std::string where;      // "10.77.0.2:41000": this attempt's address, for messages
  std::string their_if;   // the peer's interface of that address ("" unknown)
  std::string local_if;   // the interface this host routes it through ("" unknown)
  std::string local_addr;  // and its address
  bool started = false;   // dialed at least once (before: waiting for its turn)
  bool refused = false;   // kMissed by refusals: nothing listens there
  Clock::time_point dial_started{};  // the current TCP handshake's start
  std::string out;  // what goes next: the Hello, then the Proof
  Nonce nonce{};     // this connection's client nonce, fresh per attempt
  Nonce server_nonce{};  // from the acceptor's challenge
  bool proved = false;  // the Proof went out: the next Reply is the verdict
  OutState state = OutState::kWaitRetry;
  Fd fd;
  bool unusable = false;  // the published address does not parse
  Clock::time_point retry_at{};
  int backoff_ms = kFirstBackoffMs;
  int refusals = 0;
  size_t sent = 0;
  Reply reply{};
  uint8_t extra[kDigestBytes] = {};  // what follows the Reply (reply_extra_bytes)
  size_t got = 0;
  std::string last_error = "waiting for its turn (addresses are tried 250 ms apart)";
  TlsPending tls;  // kTls: the TLS handshake after the kOk (mesh_tls.cc)
};

struct Mesh::Incoming {
  Fd fd;
  std::string remote;
  Hello hello{};
  Proof proof{};
  Nonce server_nonce{};
  bool challenged = false;  // the challenge went out: the Proof is being read
  size_t got = 0;  // bytes of the Hello (then of the Proof) received so far
  TlsPending tls;  // the kOk went out and the TLS handshake runs (mesh_tls.cc)
};

}  // namespace comm::transport::sock

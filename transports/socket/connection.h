// The socket transport's bookkeeping: preallocated requests split into parts, and per
// connection FIFO queues of parts to send and parts expected, threaded through the
// requests (no allocation per message).
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>

#include "socket/net.h"
#include "socket/wire.h"
#include "tls/tls.h"
#include "transport.h"

namespace comm::transport::sock {

constexpr uint32_t kNil = UINT32_MAX;

// One stripe of a message, carried by connection `conn` of the request's peer.
struct Part {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t done = 0;       // send: header + payload bytes written; receive: payload bytes read
  uint32_t next = kNil;    // the next part queued on the same connection (a PartLink)
  bool finished = false;
};

struct Request {  // in the transport's RequestPool (transports/common/request_pool.h)
  bool is_send = false;
  uint8_t nparts = 0;
  uint8_t parts_left = 0;
  bool large = false;  // counted in open_large_ while unfinished: the progress thread's work
  bool flowing = false;  // a receive whose header matched: its bytes are on their way
  // A wait's last look found this receive unfinished (1), and flowing (2): the wait charges the
  // stretch to its peer (transports/common/arrivals.h, Arrivals::waited). 0: not charged.
  uint8_t waiting = 0;
  int peer = -1;
  OpTag tag;
  char* buf = nullptr;
  uint64_t bytes = 0;
  Part parts[kMaxConns];
  // A receive from any rank (irecv_any) until it matched: peer -1, no parts, in the transport's
  // queue of such receives (threaded through any_next).
  bool any = false;
  int* source = nullptr;
  const uint64_t* next_seq = nullptr;
  uint32_t any_next = kNil;  // transports/common/any_source.h
};

// A part is named by request index * kMaxConns + part index.
using PartLink = uint32_t;

struct PartQueue {
  PartLink head = kNil;
  PartLink tail = kNil;
  bool empty() const { return head == kNil; }
};

enum class RecvState : uint8_t {
  kHeader,     // reading a frame header
  kPayload,    // reading a DATA part into the matched receive's buffer
  kStashed,    // a DATA header waits for its receive to be posted; its payload stays in the kernel
  kErrorText,  // reading an ERROR frame's message
};

struct Connection {
  Fd fd;
  std::unique_ptr<tls::Session> tls;  // COMM_TLS: every byte through it (mesh_tls.cc); null: plaintext
  std::string remote;
  int peer = -1;
  int index = 0;

  PartQueue sends;         // in posting order
  FrameHeader send_hdr{};  // header of sends.head while it goes out

  PartQueue receives;      // expected parts, in posting order
  RecvState state = RecvState::kHeader;
  FrameHeader recv_hdr{};
  size_t hdr_got = 0;
  char error_text[kMaxErrorText];
  size_t text_got = 0;

  FrameHeader beat_hdr{};  // a HEARTBEAT going out (heartbeat.cc)
  uint8_t beat_left = 0;    // its bytes not written yet (a nearly full socket buffer); 0: none
  bool said_goodbye = false;  // the peer sent GOODBYE here: its close is comm_destroy, not a death

  bool hup_seen = false;     // hung up while stashed: poll would report it forever, so skip it
  bool closed = false;       // nothing more moves on it
  bool close_is_exit = true;  // closed / reset (the peer died), rather than garbage
  bool close_is_network = false;  // never connected: no address of the peer leads to it
  std::string close_reason;  // completes "rank 3 <reason> during allreduce #5"
};

// Every byte of a connection goes through these two: sendmsg(2) / recv(2), or the TLS session
// with the same semantics (tls/tls.h), so the byte loops of progress.cc are the same for both.
inline ssize_t conn_send(Connection& c, const iovec* iov, int niov) {
  if (c.tls) return c.tls->writev(iov, niov);
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(niov);
  return ::sendmsg(c.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}
inline ssize_t conn_recv(Connection& c, void* buf, size_t n) {
  if (c.tls) return c.tls->read(buf, n);
  return ::recv(c.fd.get(), buf, n, MSG_DONTWAIT);
}
// Bytes a TLS session already read from the socket: poll() does not see them.
inline bool conn_buffered(const Connection& c) { return c.tls && c.tls->pending(); }

}  // namespace comm::transport::sock

// What the TLS tests share (tests/base/test_tls*.cc): loopback pairs, contexts, both handshakes
// stepped in one thread, a payload, libcomm's records driven directly (RecordsTestAccess: records
// of any content type under the sender's key), and the per-key record count lowered for a test.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "posix/fd.h"
#include "status.h"
#include "support/transport_test.h"
#include "tls/records.h"
#include "tls/tls.h"

namespace comm::tls {
struct RecordsTestAccess {
  // One record of `type` holding `content`, under the sender's current key (and sequence number).
  static std::vector<uint8_t> seal(Records& r, uint8_t type, const std::vector<uint8_t>& content) {
    std::vector<uint8_t> out(content.size() + 64);
    const iovec iov{const_cast<uint8_t*>(content.data()), content.size()};
    const size_t n = r.seal(type, &iov, 1, 0, content.size(), out.data());
    REQUIRE(n > 0);
    out.resize(n);
    return out;
  }
  // What the sender does after sealing a KeyUpdate: its next records go under the next secret.
  static void next_send_key(Records& r) { REQUIRE(r.next_key(&r.tx_)); }
  // The plaintext held for the caller (plain_), all of its bytes: wiped once handed out.
  static std::vector<uint8_t> held_plaintext(const Records& r) { return r.plain_; }
  // The peer asked for an update: this end's next write leads with its KeyUpdate.
  static bool update_due(const Records& r) { return r.key_update_due_; }
};
}  // namespace comm::tls

namespace comm::tls_test {

namespace tls = comm::tls;
namespace posix = comm::posix;

// A connected TCP pair on loopback, both ends non-blocking.
inline void tcp_pair(posix::Fd* a, posix::Fd* b) {
  posix::Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0);
  REQUIRE(::listen(listener.get(), 1) == 0);
  REQUIRE(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  a->reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(::connect(a->get(), reinterpret_cast<sockaddr*>(&addr), len) == 0);
  b->reset(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  REQUIRE(b->valid());
  for (int fd : {a->get(), b->get()}) REQUIRE(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
}

inline std::shared_ptr<tls::Context> context(const tls::Config& config) {
  std::shared_ptr<tls::Context> ctx;
  Status st = tls::Context::create(config, &ctx);
  INFO(st.message());
  REQUIRE(st.ok());
  return ctx;
}

inline tls::Config psk_config(const std::string& secret) {
  tls::Config c;
  c.psk = tls::psk_from_secret(secret, "socket");
  return c;
}

// Both handshakes in one thread, step by step, until both end (or 10 s pass).
inline void handshake_both(tls::Session& client, tls::Session& server, tls::Step* cs, tls::Step* ss) {
  *cs = tls::Step::kWantWrite;
  *ss = tls::Step::kWantRead;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto running = [](tls::Step s) { return s == tls::Step::kWantRead || s == tls::Step::kWantWrite; };
  while ((running(*cs) || running(*ss)) && std::chrono::steady_clock::now() < until) {
    if (running(*cs)) *cs = client.handshake();
    if (running(*ss)) *ss = server.handshake();
    if (running(*cs) || running(*ss)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Records::records_per_key (when a sender of ours updates) lowered for one test.
struct RecordsPerKey {
  explicit RecordsPerKey(uint64_t n) : saved(tls::Records::records_per_key) { tls::Records::records_per_key = n; }
  ~RecordsPerKey() { tls::Records::records_per_key = saved; }
  uint64_t saved;
};

// Records::max_records_per_key (AES-GCM's limit, where a receiver warns) lowered for one test.
struct MaxRecordsPerKey {
  explicit MaxRecordsPerKey(uint64_t n) : saved(tls::Records::max_records_per_key) {
    tls::Records::max_records_per_key = n;
  }
  ~MaxRecordsPerKey() { tls::Records::max_records_per_key = saved; }
  uint64_t saved;
};

inline constexpr uint8_t kHandshakeType = 22, kAppDataType = 23;

struct RecordsPair {
  posix::Fd a, b;
  std::unique_ptr<tls::Records> sender, receiver;  // on a, on b
};

// receiver_is_client: the receiver is the TLS client (the one that takes a NewSessionTicket).
// Each end's AES-GCM is the process's unless given (tls/gcm.h).
inline void make_records_pair(RecordsPair* p, bool receiver_is_client,
                       tls::gcm::Engine sender_engine = tls::gcm::chosen_engine(),
                       tls::gcm::Engine receiver_engine = tls::gcm::chosen_engine()) {
  tcp_pair(&p->a, &p->b);
  const std::string one(32, '\x11'), two(32, '\x22');
  std::string why;
  p->sender = tls::Records::create(p->a.get(), !receiver_is_client, one, two, &why, sender_engine);
  REQUIRE(p->sender);
  p->receiver = tls::Records::create(p->b.get(), receiver_is_client, two, one, &why, receiver_engine);
  REQUIRE(p->receiver);
}

// `bytes` of the transport tests' pattern (support/transport_test.h), as sender 1's first message.
inline std::vector<uint8_t> payload(size_t bytes) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = comm::testing::pattern(1, 0, i);
  return v;
}

inline std::vector<uint8_t> key_update(uint8_t requested) { return {24, 0, 0, 1, requested}; }

// A NewSessionTicket (type 4) whose body is `body_bytes` of filler.
inline std::vector<uint8_t> ticket(size_t body_bytes) {
  std::vector<uint8_t> m(4 + body_bytes, 0x7e);
  m[0] = 4;
  m[1] = static_cast<uint8_t>(body_bytes >> 16);
  m[2] = static_cast<uint8_t>(body_bytes >> 8);
  m[3] = static_cast<uint8_t>(body_bytes);
  return m;
}

inline std::vector<uint8_t> cat(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  std::vector<uint8_t> r(a.size() + b.size());
  std::memcpy(r.data(), a.data(), a.size());
  std::memcpy(r.data() + a.size(), b.data(), b.size());
  return r;
}
inline std::vector<uint8_t> slice(const std::vector<uint8_t>& v, size_t from, size_t to) {
  const auto begin = v.begin();
  return std::vector<uint8_t>(begin + static_cast<std::ptrdiff_t>(from), begin + static_cast<std::ptrdiff_t>(to));
}

// Sealed records onto the sender's socket as they are (a fresh connection's buffer takes them).
inline void send_records(RecordsPair& p, const std::vector<std::vector<uint8_t>>& records) {
  std::vector<uint8_t> wire;
  for (const auto& r : records) wire.insert(wire.end(), r.begin(), r.end());
  REQUIRE(::send(p.a.get(), wire.data(), wire.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(wire.size()));
}

// Then `text` through the sender's writev, as application data.
inline void send_text(tls::Records& r, const std::string& text) {
  const iovec iov{const_cast<char*>(text.data()), text.size()};
  REQUIRE(r.writev(&iov, 1) == static_cast<ssize_t>(text.size()));
}

struct ReadOutcome {
  std::string got;
  int err = 0;  // the errno of a read that failed (not EAGAIN); 0: none failed
  std::string why;
};

// Reads until `want` bytes came, a read failed or 10 s went by.
inline ReadOutcome read_until(tls::Records& r, size_t want) {
  ReadOutcome o;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (o.got.size() < want && std::chrono::steady_clock::now() < until) {
    char buf[4096];
    const ssize_t n = r.read(buf, sizeof buf);
    if (n > 0) {
      o.got.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      o.err = -1;  // a close
      break;
    } else if (errno == EAGAIN) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else {
      o.err = errno;
      o.why = r.why();
      break;
    }
  }
  return o;
}

}  // namespace comm::tls_test

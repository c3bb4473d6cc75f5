// libcomm's own TLS records (libcomm/base/tls/records.h: what seals where the kernel has no TLS):
// against OpenSSL's record layer across key updates; altered or dropped records; and, end to end
// without a handshake (two Records on a TCP pair), handshake messages fragmented and coalesced
// across records, an ipsec-mb end against an OpenSSL end, and a write's retry from other memory.
#include <sys/socket.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tls_test_support.h"

using namespace comm;
using namespace comm::tls_test;

namespace {

const std::string kSecret = "job-secret-tls-relay-0123456789";

// Both ways at once until each end has `bytes` from the other (or 20 s went by).
void exchange_both_ways(tls::Session& x, tls::Session& y, size_t bytes) {
  const std::vector<uint8_t> out = payload(bytes);
  std::vector<uint8_t> in_x(bytes), in_y(bytes);
  size_t sent_x = 0, sent_y = 0, got_x = 0, got_y = 0;
  auto step = [&](tls::Session& s, size_t* sent, std::vector<uint8_t>& in, size_t* got) {
    if (*sent < out.size()) {
      iovec iov{const_cast<uint8_t*>(out.data()) + *sent, out.size() - *sent};
      ssize_t n = s.writev(&iov, 1);
      if (n > 0) *sent += static_cast<size_t>(n);
      else REQUIRE(errno == EAGAIN);
    }
    if (*got == in.size()) return;
    ssize_t n = s.read(in.data() + *got, in.size() - *got);
    INFO(s.why());
    if (n > 0) *got += static_cast<size_t>(n);
    else REQUIRE((n < 0 && errno == EAGAIN));
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((got_x < bytes || got_y < bytes) && std::chrono::steady_clock::now() < until) {
    step(x, &sent_x, in_x, &got_x);
    step(y, &sent_y, in_y, &got_y);
  }
  REQUIRE(got_x == bytes);
  REQUIRE(got_y == bytes);
  CHECK(in_x == out);
  CHECK(in_y == out);
}

}  // namespace

// libcomm seals and opens the records itself where the kernel has no TLS (tls/records.h): OpenSSL's
// record layer, the reference, must read them and be read by them, across key updates.
TEST_CASE("libcomm's TLS records and OpenSSL's read each other, both ways, across key updates", "[tls-own]") {
  auto own = context(psk_config(kSecret));
  REQUIRE(own->own_records());  // [tls-own]: run only where the kernel has no TLS (tests/meson.build)
  tls::Config c = psk_config(kSecret);
  c.openssl_records = true;
  auto openssl = context(c);
  RecordsPerKey every(5);  // 1 MiB is 64 records: a dozen key updates each way
  for (int mix = 0; mix < 3; ++mix) {
    INFO("client " << (mix == 2 ? "OpenSSL's" : "libcomm's") << " records, server " << (mix == 1 ? "OpenSSL's" : "libcomm's"));
    posix::Fd a, b;
    tcp_pair(&a, &b);
    std::unique_ptr<tls::Session> client, server;
    REQUIRE(tls::Session::create(mix == 2 ? openssl : own, a.get(), tls::Role::kClient, &client).ok());
    REQUIRE(tls::Session::create(mix == 1 ? openssl : own, b.get(), tls::Role::kServer, &server).ok());
    tls::Step cs, ss;
    handshake_both(*client, *server, &cs, &ss);
    REQUIRE(cs == tls::Step::kDone);
    REQUIRE(ss == tls::Step::kDone);
    CHECK(client->own_records() == (mix != 2));
    CHECK(server->own_records() == (mix != 1));
    exchange_both_ways(*client, *server, 1 << 20);
  }
}

TEST_CASE("libcomm's TLS records: a byte altered in transit fails the read, and says so", "[tls-own]") {
  auto ctx = context(psk_config(kSecret));
  REQUIRE(ctx->own_records());  // [tls-own]: run only where the kernel has no TLS (tests/meson.build)
  // client on a, its bytes to b; the test forwards b <-> c; the server on d.
  posix::Fd a, b, c, d;
  tcp_pair(&a, &b);
  tcp_pair(&c, &d);
  auto forward = [](int from, int to, bool flip) {
    char buf[65536];
    ssize_t n = ::recv(from, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) return;
    if (flip) buf[n - 20] ^= 0x01;  // inside the ciphertext of the last record read
    REQUIRE(::send(to, buf, static_cast<size_t>(n), MSG_NOSIGNAL) == n);
  };
  std::unique_ptr<tls::Session> client, server;
  REQUIRE(tls::Session::create(ctx, a.get(), tls::Role::kClient, &client).ok());
  REQUIRE(tls::Session::create(ctx, d.get(), tls::Role::kServer, &server).ok());
  tls::Step cs = tls::Step::kWantWrite, ss = tls::Step::kWantRead;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto running = [](tls::Step s) { return s == tls::Step::kWantRead || s == tls::Step::kWantWrite; };
  while ((running(cs) || running(ss)) && std::chrono::steady_clock::now() < until) {
    if (running(cs)) cs = client->handshake();
    forward(b.get(), c.get(), false);
    if (running(ss)) ss = server->handshake();
    forward(c.get(), b.get(), false);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(cs == tls::Step::kDone);
  REQUIRE(ss == tls::Step::kDone);
  const std::vector<uint8_t> out = payload(1000);
  REQUIRE(client->write(out.data(), out.size()) == static_cast<ssize_t>(out.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  forward(b.get(), c.get(), true);
  std::vector<uint8_t> in(out.size(), 0xAA);
  ssize_t n = -1;
  int err = 0;
  for (int i = 0; i < 2000; ++i) {
    n = server->read(in.data(), in.size());
    err = errno;
    if (n >= 0 || err != EAGAIN) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(n == -1);
  CHECK(err == EPROTO);
  CHECK_THAT(server->why(), Catch::Contains("does not authenticate"));
  // The record was opened straight into the caller's buffer (it had room) and did not
  // authenticate: none of its would-be plaintext (the payload, one bit off) stays there.
  size_t left = 0;
  for (size_t i = 0; i < in.size(); ++i) left += in[i] == out[i] && out[i] != 0 && out[i] != 0xAA;
  CHECK(left == 0);
}

// A record that fails in the middle of a read: the records before it are handed out, then the
// failure, and it stays: the record after it must never read as the next one (an attacker who
// could drop a record unnoticed could cut a stream).
TEST_CASE("libcomm's TLS records: after a record that fails, no later record is read", "[tls-own]") {
  auto ctx = context(psk_config(kSecret));
  REQUIRE(ctx->own_records());  // [tls-own]: run only where the kernel has no TLS (tests/meson.build)
  posix::Fd a, b, c, d;  // client on a, its bytes to b; the test forwards b -> c; the server on d
  tcp_pair(&a, &b);
  tcp_pair(&c, &d);
  std::unique_ptr<tls::Session> client, server;
  REQUIRE(tls::Session::create(ctx, a.get(), tls::Role::kClient, &client).ok());
  REQUIRE(tls::Session::create(ctx, d.get(), tls::Role::kServer, &server).ok());
  auto pass = [](int from, int to) {
    char buf[65536];
    ssize_t n = ::recv(from, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) REQUIRE(::send(to, buf, static_cast<size_t>(n), MSG_NOSIGNAL) == n);
  };
  tls::Step cs = tls::Step::kWantWrite, ss = tls::Step::kWantRead;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto running = [](tls::Step s) { return s == tls::Step::kWantRead || s == tls::Step::kWantWrite; };
  while ((running(cs) || running(ss)) && std::chrono::steady_clock::now() < until) {
    if (running(cs)) cs = client->handshake();
    pass(b.get(), c.get());
    if (running(ss)) ss = server->handshake();
    pass(c.get(), b.get());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(cs == tls::Step::kDone);
  REQUIRE(ss == tls::Step::kDone);
  // Three records of 100 bytes (one per write), 122 bytes each on the wire; the second altered.
  const std::vector<uint8_t> out = payload(300);
  for (int r = 0; r < 3; ++r) REQUIRE(client->write(out.data() + 100 * r, 100) == 100);
  std::vector<uint8_t> wire;
  const auto by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (wire.size() < 3 * 122 && std::chrono::steady_clock::now() < by) {
    char buf[4096];
    ssize_t n = ::recv(b.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) wire.insert(wire.end(), buf, buf + n);
    else std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(wire.size() == 3 * 122);
  wire[122 + 40] ^= 0x01;  // inside the second record's ciphertext
  REQUIRE(::send(c.get(), wire.data(), wire.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(wire.size()));
  std::vector<uint8_t> in(1000);
  size_t got = 0;
  int failures = 0;
  for (int i = 0; i < 2000 && failures < 3; ++i) {  // reads go on after the failure: it must stay
    ssize_t n = server->read(in.data() + got, in.size() - got);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    REQUIRE(n == -1);
    if (errno == EAGAIN) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    CHECK(errno == EPROTO);
    CHECK_THAT(server->why(), Catch::Contains("does not authenticate"));
    ++failures;
  }
  CHECK(failures == 3);
  REQUIRE(got == 100);  // the first record only: never the third
  CHECK(std::equal(out.begin(), out.begin() + 100, in.begin()));
}

// ---- libcomm's records, end to end without a handshake: two Records on a TCP pair, one key each
// way. Records of any content type are sealed by Records' own code (tls_test_support.h).

// RFC 8446 section 5.1: a handshake message may be fragmented across records. The key moves when
// the record that completes the KeyUpdate ends; update_requested makes the receiver update too.
TEST_CASE("libcomm's TLS records: a KeyUpdate split across two records is applied", "[tls]") {
  RecordsPair p;
  make_records_pair(&p, false);
  auto& seal = tls::RecordsTestAccess::seal;
  const std::vector<uint8_t> ku = key_update(1);
  send_records(p, {seal(*p.sender, kHandshakeType, slice(ku, 0, 2)), seal(*p.sender, kHandshakeType, slice(ku, 2, 5))});
  tls::RecordsTestAccess::next_send_key(*p.sender);
  send_text(*p.sender, "under the next key");
  ReadOutcome o = read_until(*p.receiver, 18);
  INFO(o.why);
  CHECK(o.err == 0);
  CHECK(o.got == "under the next key");
  // Asked to: the receiver's next write leads with its own KeyUpdate, which the sender reads.
  send_text(*p.receiver, "and back");
  o = read_until(*p.sender, 8);
  INFO(o.why);
  CHECK(o.err == 0);
  CHECK(o.got == "and back");
}

TEST_CASE("libcomm's TLS records: a client takes a NewSessionTicket coalesced or fragmented with a KeyUpdate",
          "[tls]") {
  RecordsPair p;
  make_records_pair(&p, true);
  auto& seal = tls::RecordsTestAccess::seal;
  SECTION("a ticket, then a KeyUpdate, in one record") {
    send_records(p, {seal(*p.sender, kHandshakeType, cat(ticket(200), key_update(0)))});
  }
  SECTION("a 64 KiB ticket across five records, the KeyUpdate at the end of the last") {
    const std::vector<uint8_t> all = cat(ticket(tls::HandshakeMessages::kMaxMessage), key_update(0));
    std::vector<std::vector<uint8_t>> records;
    for (size_t at = 0; at < all.size(); at += 16384)
      records.push_back(seal(*p.sender, kHandshakeType, slice(all, at, std::min(all.size(), at + 16384))));
    REQUIRE(records.size() == 5);
    send_records(p, records);
  }
  tls::RecordsTestAccess::next_send_key(*p.sender);
  send_text(*p.sender, "under the next key");
  const ReadOutcome o = read_until(*p.receiver, 18);
  INFO(o.why);
  CHECK(o.err == 0);
  CHECK(o.got == "under the next key");
}

// A host whose records use ipsec-mb and one whose use OpenSSL's EVP talk: each opens what the
// other sealed, in both directions, across KeyUpdates (every 4 records here) and records cut at
// odd sizes. The engines agree byte for byte (test_gcm.cc); this checks the records around them
// (nonce, header as additional data, content type) agree too. Where ipsec-mb does not load, its
// meson test says SKIP (tests/base/meson.build).
TEST_CASE("libcomm's TLS records: an ipsec-mb end and an OpenSSL end read each other", "[ipsec-mb]") {
  REQUIRE(tls::gcm::ipsec_mb_usable(nullptr, nullptr));
  RecordsPair p;
  make_records_pair(&p, true, tls::gcm::Engine::kIpsecMb, tls::gcm::Engine::kOpenSsl);
  RecordsPerKey few(4);
  for (tls::Records* from : {p.sender.get(), p.receiver.get()}) {
    tls::Records* to = from == p.sender.get() ? p.receiver.get() : p.sender.get();
    std::vector<uint8_t> text(300007);
    for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
    std::vector<uint8_t> got;
    size_t sent = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (got.size() < text.size() && std::chrono::steady_clock::now() < until) {
      if (sent < text.size()) {  // pieces of odd sizes: records end mid-piece and mid-block
        const size_t n = std::min(text.size() - sent, size_t{777} + sent % 40000);
        const iovec iov{text.data() + sent, n};
        const ssize_t k = from->writev(&iov, 1);
        if (k > 0) sent += static_cast<size_t>(k);
        REQUIRE((k >= 0 || errno == EAGAIN));
      }
      uint8_t buf[65536];
      const ssize_t r = to->read(buf, sizeof buf);
      if (r > 0) got.insert(got.end(), buf, buf + r);
      INFO(to->why());
      REQUIRE((r > 0 || (r < 0 && errno == EAGAIN)));
    }
    CHECK(got == text);
  }
}

// The key changes at the end of the record holding the KeyUpdate, so nothing may follow it there.
TEST_CASE("libcomm's TLS records: a KeyUpdate followed by more handshake bytes in its record fails", "[tls]") {
  RecordsPair p;
  make_records_pair(&p, true);
  auto& seal = tls::RecordsTestAccess::seal;
  send_records(p, {seal(*p.sender, kHandshakeType, cat(key_update(0), slice(ticket(100), 0, 3)))});
  tls::RecordsTestAccess::next_send_key(*p.sender);
  send_text(*p.sender, "under the next key");
  const ReadOutcome o = read_until(*p.receiver, 18);
  CHECK(o.got.empty());
  CHECK(o.err == EPROTO);
  CHECK_THAT(o.why, Catch::Contains("KeyUpdate followed by more handshake bytes"));
}

TEST_CASE("libcomm's TLS records: application data between the fragments of a handshake message fails",
          "[tls]") {
  RecordsPair p;
  make_records_pair(&p, true);
  auto& seal = tls::RecordsTestAccess::seal;
  const std::vector<uint8_t> t = ticket(100);
  send_records(p, {seal(*p.sender, kHandshakeType, slice(t, 0, 50)), seal(*p.sender, kAppDataType, {'x', 'y'}),
                   seal(*p.sender, kHandshakeType, slice(t, 50, t.size()))});
  send_text(*p.sender, "after it");
  const ReadOutcome o = read_until(*p.receiver, 10);
  CHECK(o.got.empty());  // not the application data inside the message, nor any after it
  CHECK(o.err == EPROTO);
  CHECK_THAT(o.why, Catch::Contains("between the fragments of a handshake message"));
}

// Refused at its header: the receiver holds nothing for it and does not wait for its body.
TEST_CASE("libcomm's TLS records: a handshake message longer than 64 KiB fails at its header", "[tls]") {
  RecordsPair p;
  make_records_pair(&p, true);
  auto& seal = tls::RecordsTestAccess::seal;
  const std::vector<uint8_t> huge = slice(ticket(tls::HandshakeMessages::kMaxMessage + 1), 0, 100);
  send_records(p, {seal(*p.sender, kHandshakeType, huge)});
  const ReadOutcome o = read_until(*p.receiver, 1);
  CHECK(o.got.empty());
  CHECK(o.err == EPROTO);
  CHECK_THAT(o.why, Catch::Contains("declares 65537 bytes"));
}

// send(2)'s contract: after a write that went out in part, the next call offers the same bytes. A
// call that offers another buffer of the same length is refused (the records already sealed from
// the first would go out as if they were its bytes); the same memory cut into other iovecs is not.
TEST_CASE("libcomm's TLS records: a retry that offers another buffer of the same length is refused", "[tls]") {
  RecordsPair p;
  make_records_pair(&p, false);
  const int small = 64 * 1024;
  REQUIRE(::setsockopt(p.a.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small) == 0);
  REQUIRE(::setsockopt(p.b.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small) == 0);
  const std::vector<uint8_t> out = payload(8 << 20);
  const std::vector<uint8_t> other(out.size(), 0x5a);
  size_t sent = 0;
  auto at = [&](const std::vector<uint8_t>& v, size_t off) { return const_cast<uint8_t*>(v.data()) + off; };
  for (;;) {  // until a write blocks with records sealed and not all sent (nothing reads yet)
    const iovec iov{at(out, sent), out.size() - sent};
    const ssize_t n = p.sender->writev(&iov, 1);
    if (n < 0) {
      REQUIRE(errno == EAGAIN);
      break;
    }
    sent += static_cast<size_t>(n);
    REQUIRE(sent < out.size());
  }
  const size_t rest = out.size() - sent;
  CHECK(p.sender->write_owed());  // records sealed from out[sent...], whatever the count said
  {
    const iovec iov{at(other, sent), rest};
    CHECK(p.sender->writev(&iov, 1) == -1);
    CHECK(errno == EINVAL);
    CHECK_THAT(p.sender->why(), Catch::Contains("other memory"));
  }
  {  // the first bytes where they were, the rest from elsewhere
    const iovec iov[2] = {{at(out, sent), 1000}, {at(other, sent + 1000), rest - 1000}};
    CHECK(p.sender->writev(iov, 2) == -1);
    CHECK(errno == EINVAL);
  }
  // The same memory in two iovecs, then the rest as it comes: every byte arrives, in order.
  std::string got;
  bool first = true;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got.size() < out.size() && std::chrono::steady_clock::now() < until) {
    if (sent < out.size()) {
      const size_t cut = first ? std::min<size_t>(1000, rest / 2) : 0;
      const iovec iov[2] = {{at(out, sent), cut}, {at(out, sent + cut), out.size() - sent - cut}};
      const ssize_t n = p.sender->writev(iov, 2);
      INFO(p.sender->why());
      if (n > 0) sent += static_cast<size_t>(n);
      else REQUIRE(errno == EAGAIN);
      first = false;
    }
    char buf[65536];
    const ssize_t n = p.receiver->read(buf, sizeof buf);
    if (n > 0) got.append(buf, static_cast<size_t>(n));
    else REQUIRE((n < 0 && errno == EAGAIN));
  }
  REQUIRE(got.size() == out.size());
  CHECK(std::equal(out.begin(), out.end(), reinterpret_cast<const uint8_t*>(got.data())));
  CHECK(!p.sender->write_owed());
}

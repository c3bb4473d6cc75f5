// Issue 33's findings about libcomm's TLS (libcomm/base/tls/), each pinned by a case that failed
// before it was fixed: no second sealer under one key (kernel TLS), key updates counted as a
// receiver counts them, a KeyUpdate's answer that asks nothing, padding never written past the
// count, alerts before a failure and close_notify at the end, the plaintext buffer wiped, nothing
// sealed by a forked child; and libcomm's records against a stock OpenSSL end (SSL_read and
// SSL_write on the same context) with each AES-GCM engine, in both roles.
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/wait.h>

#include <algorithm>
#include <new>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "tls_test_support.h"

using namespace comm;
using namespace comm::tls_test;

namespace {

const std::string kSecret = "job-secret-tls-safety-0123456789";

struct SessionPair {
  posix::Fd a, b;
  std::unique_ptr<tls::Session> client, server;  // on a, on b
};

void make_session_pair(SessionPair* p, const std::shared_ptr<tls::Context>& client_ctx,
                       const std::shared_ptr<tls::Context>& server_ctx) {
  tcp_pair(&p->a, &p->b);
  REQUIRE(tls::Session::create(client_ctx, p->a.get(), tls::Role::kClient, &p->client).ok());
  REQUIRE(tls::Session::create(server_ctx, p->b.get(), tls::Role::kServer, &p->server).ok());
  tls::Step cs, ss;
  handshake_both(*p->client, *p->server, &cs, &ss);
  INFO(p->client->why() << " / " << p->server->why());
  REQUIRE(cs == tls::Step::kDone);
  REQUIRE(ss == tls::Step::kDone);
}

// `text` from one end, read whole at the other (small enough for a socket's buffer); the reader's
// outcome: the bytes, or errno and why() of the read that failed, or -1 for a close.
ReadOutcome send_and_read(tls::Session& from, tls::Session& to, const std::string& text) {
  size_t sent = 0;
  ReadOutcome o;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (o.got.size() < text.size() && std::chrono::steady_clock::now() < until) {
    if (sent < text.size()) {
      const ssize_t k = from.write(text.data() + sent, text.size() - sent);
      if (k > 0) sent += static_cast<size_t>(k);
      REQUIRE((k > 0 || errno == EAGAIN));
    }
    char buf[4096];
    const ssize_t n = to.read(buf, sizeof buf);
    if (n > 0) {
      o.got.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      o.err = -1;
      break;
    } else if (errno != EAGAIN) {
      o.err = errno;
      o.why = to.why();
      break;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return o;
}

// Reads until the end of the stream (0), a failure or 10 s: 0 for a close, else the errno.
int read_to_end(tls::Session& s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    char buf[256];
    const ssize_t n = s.read(buf, sizeof buf);
    if (n == 0) return 0;
    if (n < 0 && errno != EAGAIN) return errno;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return ETIMEDOUT;
}

// `text` client to server one 6-byte frame per write (a record each, as a ring's stripes of small
// messages send them); what the server read.
std::string one_way_frames(SessionPair& p, const std::string& text) {
  std::string got;
  for (size_t at = 0; at < text.size(); at += 6) {
    const ReadOutcome one = send_and_read(*p.client, *p.server, text.substr(at, 6));
    got += one.got;
    INFO(one.why);
    REQUIRE(one.err == 0);
  }
  return got;
}

struct PretendKernelSend {
  PretendKernelSend() { tls::Session::pretend_kernel_send = true; }
  ~PretendKernelSend() { tls::Session::pretend_kernel_send = false; }
};

}  // namespace

// Fix 1: OpenSSL hands a context's keys to the kernel when the context asks (SSL_OP_ENABLE_KTLS)
// and the kernel can; libcomm's records would then seal the same sequence numbers a second time.
TEST_CASE("a TLS context whose sessions seal libcomm's records never asks for kernel TLS", "[tls-own]") {
  auto ctx = context(psk_config(kSecret));
  REQUIRE(ctx->own_records());
  CHECK((SSL_CTX_get_options(ctx->get()) & SSL_OP_ENABLE_KTLS) == 0);
}

TEST_CASE("where the kernel took a connection's sends, libcomm does not seal its records as well", "[tls-own]") {
  PretendKernelSend kernel;
  SessionPair p;
  make_session_pair(&p, context(psk_config(kSecret)), context(psk_config(kSecret)));
  CHECK_FALSE(p.client->own_records());
  CHECK_FALSE(p.server->own_records());
  // The handover refused on both ends: OpenSSL keeps the records, and they still flow.
  ReadOutcome o = send_and_read(*p.client, *p.server, "one sealer");
  CHECK(o.got == "one sealer");
  o = send_and_read(*p.server, *p.client, "each way");
  CHECK(o.got == "each way");
}

// Fix 2: a sender on OpenSSL's records updated its key every 128 GiB, a receiver on libcomm's
// refused a peer past 2^24.5 records: small frames on a one-way connection failed the job.
TEST_CASE("small frames past the per-key limit on a one-way connection: the receiver reads on", "[tls-own]") {
  tls::Config sender_config = psk_config(kSecret);
  sender_config.openssl_records = true;
  SessionPair p;
  MaxRecordsPerKey limit(100);
  std::string text;
  for (int i = 0; i < 1500; ++i) text += "frame" + std::to_string(i % 10);
  SECTION("a sender that updates by records sent (ours, on OpenSSL's records)") {
    RecordsPerKey every(64);
    make_session_pair(&p, context(sender_config), context(psk_config(kSecret)));
    REQUIRE(p.server->own_records());
    REQUIRE_FALSE(p.client->own_records());
    CHECK(one_way_frames(p, text) == text);
    CHECK_FALSE(p.server->peer_over_key_limit());  // the sender moved its key in time
  }
  SECTION("a sender that never updates (kernel TLS that cannot rekey): warned about, not failed") {
    RecordsPerKey never(uint64_t{1} << 40);
    make_session_pair(&p, context(sender_config), context(psk_config(kSecret)));
    CHECK(one_way_frames(p, text) == text);
    CHECK(p.server->peer_over_key_limit());
  }
}

// RFC 8446 section 4.6.3: the KeyUpdate that answers update_requested must not request one itself.
// The receiver here also wanted its peer to update (records_per_key of them came under one key).
TEST_CASE("libcomm's TLS records: the answer to a requested KeyUpdate requests none", "[tls]") {
  RecordsPerKey every(4);
  RecordsPair p;
  make_records_pair(&p, false);
  auto& seal = tls::RecordsTestAccess::seal;
  std::vector<std::vector<uint8_t>> five;
  for (int i = 0; i < 5; ++i) five.push_back(seal(*p.sender, kAppDataType, {'r'}));
  send_records(p, five);
  REQUIRE(read_until(*p.receiver, 5).got == "rrrrr");  // the 5th came at records_per_key: ask the peer
  send_records(p, {seal(*p.sender, kHandshakeType, key_update(1))});
  tls::RecordsTestAccess::next_send_key(*p.sender);
  send_text(*p.sender, "k");
  ReadOutcome o = read_until(*p.receiver, 1);
  INFO(o.why);
  REQUIRE(o.got == "k");
  send_text(*p.receiver, "back");  // leads with the receiver's own KeyUpdate
  o = read_until(*p.sender, 4);
  INFO(o.why);
  REQUIRE(o.got == "back");
  CHECK_FALSE(tls::RecordsTestAccess::update_due(*p.sender));
}

// Section 5.4: a peer may pad. The caller's bytes past the count read are the caller's.
TEST_CASE("libcomm's TLS records: a padded record's padding is never written past the count", "[tls]") {
  RecordsPair p;
  make_records_pair(&p, false);
  std::vector<uint8_t> content = {'h', 'e', 'l', 'l', 'o', kAppDataType};
  content.resize(content.size() + 99, 0);  // then seal() adds one more zero as the "type"
  send_records(p, {tls::RecordsTestAccess::seal(*p.sender, 0, content)});
  std::vector<uint8_t> buf(4096, 0xab);
  ssize_t n = -1;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((n = p.receiver->read(buf.data(), buf.size())) < 0 && errno == EAGAIN &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  INFO(p.receiver->why());
  REQUIRE(n == 5);
  CHECK(std::string(buf.begin(), buf.begin() + 5) == "hello");
  CHECK(std::all_of(buf.begin() + 5, buf.end(), [](uint8_t c) { return c == 0xab; }));
}

TEST_CASE("libcomm's TLS records: a record that does not authenticate sends bad_record_mac first", "[tls]") {
  RecordsPair p;
  make_records_pair(&p, false);
  std::vector<uint8_t> rec = tls::RecordsTestAccess::seal(*p.sender, kAppDataType, {'x', 'y'});
  rec.back() ^= 1;  // the tag
  send_records(p, {rec});
  ReadOutcome o = read_until(*p.receiver, 2);
  REQUIRE(o.err == EPROTO);
  // The sender learns why from the alert, not from a connection that just went silent.
  o = read_until(*p.sender, 1);
  CHECK(o.err == EPROTO);
  CHECK_THAT(o.why, Catch::Contains("alert 20"));
}

TEST_CASE("a TLS session that ends sends close_notify; a cut stream is no clean close", "[tls-own]") {
  auto ctx = context(psk_config(kSecret));
  SessionPair p;
  make_session_pair(&p, ctx, ctx);
  REQUIRE(send_and_read(*p.client, *p.server, "last words").got == "last words");
  SECTION("the session destroyed") {
    p.client.reset();
    CHECK(read_to_end(*p.server) == 0);
    CHECK(p.server->peer_closed_cleanly());
  }
  SECTION("the connection cut under it") {
    REQUIRE(::shutdown(p.a.get(), SHUT_RDWR) == 0);
    CHECK(read_to_end(*p.server) == 0);  // still a close, as callers expect (they name the peer)
    CHECK_FALSE(p.server->peer_closed_cleanly());
  }
}

TEST_CASE("libcomm's TLS records: the plaintext held for the caller is wiped once handed out", "[tls]") {
  RecordsPair p;
  make_records_pair(&p, false);
  const std::string text(1000, 'p');
  send_text(*p.sender, text);
  std::string got;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (got.size() < text.size() && std::chrono::steady_clock::now() < until) {
    char buf[10];  // smaller than the record: it waits in the plaintext buffer
    const ssize_t n = p.receiver->read(buf, sizeof buf);
    if (n > 0) got.append(buf, static_cast<size_t>(n));
    else REQUIRE(errno == EAGAIN);
  }
  REQUIRE(got == text);
  const std::vector<uint8_t> held = tls::RecordsTestAccess::held_plaintext(*p.receiver);
  CHECK(std::count(held.begin(), held.end(), 'p') == 0);
}

// A child of fork() has copies of the parent's sequence numbers: a record it sealed would reuse a
// nonce the parent uses next. It must not write, nor close the parent's stream on its way out.
TEST_CASE("a TLS session is refused in a forked child, which sends nothing on it", "[tls-own]") {
  auto ctx = context(psk_config(kSecret));
  SessionPair p;
  make_session_pair(&p, ctx, ctx);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const ssize_t w = p.client->write("x", 1);
    const bool refused = w == -1 && errno == EPROTO;
    p.client.reset();  // no close_notify from here
    ::_exit(refused ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // The parent's next record is the next the server expects: nothing came between.
  const ReadOutcome o = send_and_read(*p.client, *p.server, "parent");
  INFO(o.why);
  CHECK(o.got == "parent");
}

// A caller may close a session's descriptor before the session (the store sheds a connection by
// its fd); the number may then belong to a new connection, whose peer must not read our
// close_notify as its first bytes (it read it as a malformed reply to its hello).
TEST_CASE("a TLS session whose descriptor now names another socket sends it nothing when it ends", "[tls-own]") {
  auto ctx = context(psk_config(kSecret));
  SessionPair p;
  make_session_pair(&p, ctx, ctx);
  posix::Fd x, y;
  tcp_pair(&x, &y);
  REQUIRE(::dup2(x.get(), p.a.get()) == p.a.get());  // the session's number, now x's socket
  p.client.reset();
  char buf[64];
  errno = 0;
  CHECK(::recv(y.get(), buf, sizeof buf, MSG_DONTWAIT) == -1);
  CHECK(errno == EAGAIN);
}

// The PSK leaves no copy behind when its Config goes (a short key, so that it lives inside the
// object's own bytes, which stay readable here after the destructor ran). What is looked for is a
// run of the key's bytes, not one byte: the four strings' pointers into these bytes (a stack
// address) hold a 0x4b ('K') in about 1 run of 50, and failed the test so.
TEST_CASE("a TLS Config wipes its pre-shared key when it goes", "[tls]") {
  alignas(tls::Config) unsigned char storage[sizeof(tls::Config)];
  auto* config = new (storage) tls::Config();
  config->psk.assign(12, 'K');  // within std::string's own buffer
  config->~Config();
  CHECK(std::search_n(storage, storage + sizeof storage, 4, static_cast<unsigned char>('K')) == storage + sizeof storage);
}

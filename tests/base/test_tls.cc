// COMM_TLS (issue 28): the TLS session wrapper (libcomm/base/tls/tls.h) on real loopback sockets:
// a handshake with the same key carries bytes both ways, a write that would block owes its bytes,
// kernel TLS reported as the kernel offers it; another key, or a certificate the CA did not sign,
// refused by its peer. libcomm's own records are in test_tls_records.cc, the socket transport over
// TLS in test_tls_socket.cc, the TCP store over TLS in test_tls_store.cc.
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tls_pki.h"
#include "tls_test_support.h"

using namespace comm;
using namespace comm::tls_test;

namespace {

const std::string kSecret = "job-secret-tls-relay-0123456789";

}  // namespace

TEST_CASE("a TLS session with the same key carries bytes both ways, as records", "[tls]") {
  posix::Fd a, b;
  tcp_pair(&a, &b);
  auto ctx = context(psk_config(kSecret));
  std::unique_ptr<tls::Session> client, server;
  REQUIRE(tls::Session::create(ctx, a.get(), tls::Role::kClient, &client).ok());
  REQUIRE(tls::Session::create(ctx, b.get(), tls::Role::kServer, &server).ok());
  tls::Step cs, ss;
  handshake_both(*client, *server, &cs, &ss);
  INFO(client->why() << " / " << server->why());
  REQUIRE(cs == tls::Step::kDone);
  REQUIRE(ss == tls::Step::kDone);
  CHECK_THAT(client->describe(), Catch::Contains("TLSv1.3") && Catch::Contains("PSK"));

  // 1 MiB through socket buffers smaller than it: both ends see EAGAIN and carry on.
  const std::vector<uint8_t> out = payload(1 << 20);
  std::vector<uint8_t> in(out.size());
  size_t sent = 0, got = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got < in.size() && std::chrono::steady_clock::now() < until) {
    if (sent < out.size()) {
      iovec iov{const_cast<uint8_t*>(out.data()) + sent, out.size() - sent};
      ssize_t n = client->writev(&iov, 1);
      if (n > 0) sent += static_cast<size_t>(n);
      else REQUIRE(errno == EAGAIN);
    }
    ssize_t n = server->read(in.data() + got, in.size() - got);
    if (n > 0) got += static_cast<size_t>(n);
    else REQUIRE((n < 0 && errno == EAGAIN));
  }
  REQUIRE(got == in.size());
  CHECK(in == out);
  // A close is a read of 0, as with recv(2).
  client.reset();
  a.reset();
  char byte;
  ssize_t n = -1;
  for (int i = 0; i < 1000 && n < 0; ++i) {
    n = server->read(&byte, 1);
    if (n < 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(n == 0);
}

// Unlike send(2), a TLS write that counted 0 bytes may have sealed records and sent part of them:
// write_owed() says so, for the socket transport's failure report (mid_frame), on libcomm's
// records and on OpenSSL's.
TEST_CASE("a TLS write that would block says its bytes are owed until they are all out", "[tls]") {
  for (const bool openssl : {false, true}) {
    tls::Config c = psk_config(kSecret);
    c.openssl_records = openssl;
    auto ctx = context(c);
    INFO((openssl ? "OpenSSL's records" : "libcomm's records"));
    posix::Fd a, b;
    tcp_pair(&a, &b);
    const int small = 64 * 1024;
    REQUIRE(::setsockopt(a.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small) == 0);
    REQUIRE(::setsockopt(b.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small) == 0);
    std::unique_ptr<tls::Session> client, server;
    REQUIRE(tls::Session::create(ctx, a.get(), tls::Role::kClient, &client).ok());
    REQUIRE(tls::Session::create(ctx, b.get(), tls::Role::kServer, &server).ok());
    tls::Step cs, ss;
    handshake_both(*client, *server, &cs, &ss);
    REQUIRE(cs == tls::Step::kDone);
    REQUIRE(ss == tls::Step::kDone);
    CHECK(!client->write_owed());
    const std::vector<uint8_t> out = payload(8 << 20);
    size_t sent = 0;
    for (;;) {  // nothing reads: the socket fills
      const ssize_t n = client->write(out.data() + sent, out.size() - sent);
      if (n < 0) {
        REQUIRE(errno == EAGAIN);
        break;
      }
      sent += static_cast<size_t>(n);
      REQUIRE(sent < out.size());
    }
    CHECK(client->write_owed());
    std::vector<uint8_t> in(out.size());
    size_t got = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (got < in.size() && std::chrono::steady_clock::now() < until) {
      if (sent < out.size()) {
        const ssize_t n = client->write(out.data() + sent, out.size() - sent);
        if (n > 0) sent += static_cast<size_t>(n);
        else REQUIRE(errno == EAGAIN);
      }
      const ssize_t n = server->read(in.data() + got, in.size() - got);
      if (n > 0) got += static_cast<size_t>(n);
      else REQUIRE((n < 0 && errno == EAGAIN));
    }
    REQUIRE(got == in.size());
    CHECK(in == out);
    CHECK(!client->write_owed());
  }
}

TEST_CASE("kernel TLS is reported as this kernel offers it", "[tls]") {
  std::string why;
  const bool available = tls::kernel_tls_available(&why);
  INFO(why);
  CHECK(!why.empty());
  // The module's statistics file exists exactly when the kernel has loaded it.
  if (std::filesystem::exists("/proc/net/tls_stat")) CHECK(available);
  if (!available) CHECK_THAT(why, Catch::Contains("CONFIG_TLS") || Catch::Contains("could not probe"));
}

TEST_CASE("a TLS peer with another key fails the handshake, and both ends say so", "[tls]") {
  posix::Fd a, b;
  tcp_pair(&a, &b);
  std::unique_ptr<tls::Session> client, server;
  REQUIRE(tls::Session::create(context(psk_config("one key")), a.get(), tls::Role::kClient, &client).ok());
  REQUIRE(tls::Session::create(context(psk_config("another key")), b.get(), tls::Role::kServer, &server).ok());
  tls::Step cs, ss;
  handshake_both(*client, *server, &cs, &ss);
  CHECK(cs == tls::Step::kFailed);
  CHECK(ss == tls::Step::kFailed);
  CHECK_THAT(client->why(), Catch::StartsWith("TLS handshake failed: "));
  CHECK_THAT(server->why(), Catch::StartsWith("TLS handshake failed: "));
}

TEST_CASE("TLS certificates: the CA's are accepted, a self-signed one is refused by its peer", "[tls]") {
  auto pki = make_pki();
  SECTION("both signed by the CA") {
    posix::Fd a, b;
    tcp_pair(&a, &b);
    std::unique_ptr<tls::Session> client, server;
    REQUIRE(tls::Session::create(context(pki->rank_a), a.get(), tls::Role::kClient, &client).ok());
    REQUIRE(tls::Session::create(context(pki->rank_b), b.get(), tls::Role::kServer, &server).ok());
    tls::Step cs, ss;
    handshake_both(*client, *server, &cs, &ss);
    INFO(client->why() << " / " << server->why());
    CHECK(cs == tls::Step::kDone);
    CHECK(ss == tls::Step::kDone);
    CHECK_THAT(client->describe(), Catch::Contains("certificates"));
  }
  SECTION("an untrusted server: the client refuses it") {
    posix::Fd a, b;
    tcp_pair(&a, &b);
    std::unique_ptr<tls::Session> client, server;
    REQUIRE(tls::Session::create(context(pki->rank_a), a.get(), tls::Role::kClient, &client).ok());
    REQUIRE(tls::Session::create(context(pki->rogue), b.get(), tls::Role::kServer, &server).ok());
    tls::Step cs, ss;
    handshake_both(*client, *server, &cs, &ss);
    CHECK(cs == tls::Step::kFailed);
    CHECK_THAT(client->why(), Catch::Contains("certificate"));
  }
  SECTION("an untrusted client: the server refuses it") {
    posix::Fd a, b;
    tcp_pair(&a, &b);
    std::unique_ptr<tls::Session> client, server;
    REQUIRE(tls::Session::create(context(pki->rogue), a.get(), tls::Role::kClient, &client).ok());
    REQUIRE(tls::Session::create(context(pki->rank_b), b.get(), tls::Role::kServer, &server).ok());
    tls::Step cs, ss;
    handshake_both(*client, *server, &cs, &ss);
    CHECK(ss == tls::Step::kFailed);
    CHECK_THAT(server->why(), Catch::Contains("certificate"));
  }
  SECTION("a key that is not the certificate's is refused at setup") {
    tls::Config bad = pki->rank_a;
    bad.key_path = pki->rank_b.key_path;
    std::shared_ptr<tls::Context> ctx;
    Status st = tls::Context::create(bad, &ctx);
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK_THAT(st.message(), Catch::Contains("COMM_TLS_KEY"));
  }
}

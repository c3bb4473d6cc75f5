// libcomm's TLS records (libcomm/base/tls/records.h) against a stock OpenSSL end: SSL_read,
// SSL_write, SSL_key_update and SSL_shutdown called directly on an SSL made from a context with
// OpenSSL's records (the same PSK callbacks), never through libcomm's Session. For each AES-GCM
// engine of libcomm's end (tls/gcm.h), in both roles: 300 KB each way in odd pieces, key updates
// from both ends (libcomm's every 5 records, OpenSSL's every 40 KB, asked to answer), then each
// side's close_notify read as a clean close by the other.
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "tls_test_support.h"

using namespace comm;
using namespace comm::tls_test;

namespace {

const std::string kSecret = "job-secret-tls-interop-0123456789";

// One step of a stock end's SSL call: true when it did something or would block.
bool stock_ok(SSL* ssl, int r) {
  if (r > 0) return true;
  const int e = SSL_get_error(ssl, r);
  return e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE;
}

void interop(tls::gcm::Engine engine, bool libcomm_is_client) {
  INFO("libcomm's end: " << tls::gcm::engine_name(engine) << (libcomm_is_client ? ", client" : ", server"));
  RecordsPerKey every(5);
  tls::Config ours = psk_config(kSecret);
  ours.engine = engine;
  tls::Config theirs = psk_config(kSecret);
  theirs.openssl_records = true;
  auto our_ctx = context(ours);
  auto their_ctx = context(theirs);
  REQUIRE(our_ctx->own_records());
  posix::Fd a, b;  // libcomm on a, stock OpenSSL on b
  tcp_pair(&a, &b);
  std::unique_ptr<tls::Session> lc;
  REQUIRE(tls::Session::create(our_ctx, a.get(), libcomm_is_client ? tls::Role::kClient : tls::Role::kServer, &lc)
              .ok());
  SSL* ssl = SSL_new(their_ctx->get());
  REQUIRE(ssl != nullptr);
  REQUIRE(SSL_set_fd(ssl, b.get()) == 1);
  if (libcomm_is_client) SSL_set_accept_state(ssl);
  else SSL_set_connect_state(ssl);
  // Both handshakes, stepped in this thread.
  tls::Step step = tls::Step::kWantWrite;
  int stock = 0;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((step != tls::Step::kDone || stock != 1) && std::chrono::steady_clock::now() < until) {
    if (step != tls::Step::kDone) step = lc->handshake();
    REQUIRE(step != tls::Step::kFailed);
    if (stock != 1) {
      stock = SSL_do_handshake(ssl);
      REQUIRE(stock_ok(ssl, stock));
    }
  }
  REQUIRE(step == tls::Step::kDone);
  REQUIRE(stock == 1);
  REQUIRE(lc->own_records());

  std::vector<uint8_t> out(300007), back(300007);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
    back[i] = static_cast<uint8_t>(i * 7 + 3);
  }
  std::vector<uint8_t> got_stock, got_lc;  // what the stock end read, what libcomm's read
  size_t sent_lc = 0, sent_stock = 0, stock_since_update = 0;
  until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((got_stock.size() < out.size() || got_lc.size() < back.size()) && std::chrono::steady_clock::now() < until) {
    if (sent_lc < out.size()) {
      const size_t n = std::min(out.size() - sent_lc, size_t{777} + sent_lc % 40000);
      const ssize_t k = lc->write(out.data() + sent_lc, n);
      INFO(lc->why());
      REQUIRE((k > 0 || errno == EAGAIN));
      if (k > 0) sent_lc += static_cast<size_t>(k);
    }
    if (sent_stock < back.size()) {
      if (stock_since_update >= 40000) {
        REQUIRE(SSL_key_update(ssl, SSL_KEY_UPDATE_REQUESTED) == 1);  // libcomm must answer
        stock_since_update = 0;
      }
      const size_t n = std::min(back.size() - sent_stock, size_t{1000} + sent_stock % 30000);
      size_t put = 0;
      const int r = SSL_write_ex(ssl, back.data() + sent_stock, n, &put);
      REQUIRE(stock_ok(ssl, r));
      sent_stock += put;
      stock_since_update += put;
    }
    uint8_t buf[65536];
    size_t got = 0;
    const int r = SSL_read_ex(ssl, buf, sizeof buf, &got);
    INFO(ERR_error_string(ERR_peek_error(), nullptr));
    REQUIRE(stock_ok(ssl, r));
    got_stock.insert(got_stock.end(), buf, buf + got);
    const ssize_t k = lc->read(buf, sizeof buf);
    INFO(lc->why());
    REQUIRE((k > 0 || errno == EAGAIN));
    if (k > 0) got_lc.insert(got_lc.end(), buf, buf + k);
  }
  CHECK(got_stock == out);
  CHECK(got_lc == back);

  // The stock end's close_notify: libcomm reads a clean close.
  ERR_clear_error();
  REQUIRE(SSL_shutdown(ssl) >= 0);
  int r = -1;
  until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  uint8_t buf[64];
  ssize_t k = -1;
  while ((k = lc->read(buf, sizeof buf)) < 0 && errno == EAGAIN && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(k == 0);
  CHECK(lc->peer_closed_cleanly());
  // libcomm's close_notify: the stock end sees SSL_ERROR_ZERO_RETURN, not an unexpected end.
  lc.reset();
  until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  size_t got = 0;
  while (std::chrono::steady_clock::now() < until) {
    r = SSL_read_ex(ssl, buf, sizeof buf, &got);
    if (r == 1 || SSL_get_error(ssl, r) != SSL_ERROR_WANT_READ) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(r == 0);
  CHECK(SSL_get_error(ssl, r) == SSL_ERROR_ZERO_RETURN);
  CHECK((SSL_get_shutdown(ssl) & SSL_RECEIVED_SHUTDOWN) != 0);
  SSL_free(ssl);
}

}  // namespace

TEST_CASE("libcomm's TLS records on OpenSSL's EVP and a stock OpenSSL end read each other", "[tls-own]") {
  interop(tls::gcm::Engine::kOpenSsl, true);
  interop(tls::gcm::Engine::kOpenSsl, false);
}

TEST_CASE("libcomm's TLS records on ipsec-mb and a stock OpenSSL end read each other", "[ipsec-mb]") {
  REQUIRE(tls::gcm::ipsec_mb_usable(nullptr, nullptr));
  interop(tls::gcm::Engine::kIpsecMb, true);
  interop(tls::gcm::Engine::kIpsecMb, false);
}

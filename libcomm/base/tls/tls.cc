#include "tls/tls.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/hmac.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "log.h"
#include "params.h"
#include "posix/fd.h"
#include "posix/fork_generation.h"
#include "tls/records.h"

#ifndef TCP_ULP
#define TCP_ULP 31
#endif

namespace comm::tls {
namespace {

// The one identity every libcomm end offers and accepts: the key, not the name, authenticates.
constexpr const char kPskIdentity[] = "libcomm";
// TLS_AES_128_GCM_SHA256: AES-NI makes it the cheapest per byte on the hosts we run on; the
// PSK's session must name one TLS 1.3 suite, and its hash (SHA-256) is what the binder uses.
const unsigned char kPskCipher[2] = {0x13, 0x01};

// OpenSSL's queue of errors of this thread, as one line; emptied.
std::string openssl_errors() {
  std::string text;
  unsigned long e;
  while ((e = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    // "error:0A000418:SSL routines::tlsv1 alert unknown ca": the reason is after the last ':'.
    const char* reason = std::strrchr(buf, ':');
    if (!text.empty()) text += "; ";
    text += reason != nullptr && reason[1] != '\0' ? reason + 1 : buf;
  }
  return text;
}

SSL_SESSION* psk_session(SSL* ssl, const std::string& key) {
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kPskCipher);
  if (cipher == nullptr) return nullptr;
  SSL_SESSION* s = SSL_SESSION_new();
  if (s == nullptr) return nullptr;
  if (SSL_SESSION_set1_master_key(s, reinterpret_cast<const unsigned char*>(key.data()), key.size()) != 1 ||
      SSL_SESSION_set_cipher(s, cipher) != 1 || SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1) {
    SSL_SESSION_free(s);
    return nullptr;
  }
  return s;
}

const Context* context_of(SSL* ssl) {
  return static_cast<const Context*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
}

int use_psk(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* idlen, SSL_SESSION** sess) {
  *sess = nullptr;
  // Asked again after a HelloRetryRequest with the hash the server chose: only ours will do.
  if (md != nullptr && EVP_MD_get_type(md) != NID_sha256) return 1;
  *sess = psk_session(ssl, context_of(ssl)->psk());
  if (*sess == nullptr) return 0;
  *id = reinterpret_cast<const unsigned char*>(kPskIdentity);
  *idlen = sizeof kPskIdentity - 1;
  return 1;
}

int find_psk(SSL* ssl, const unsigned char* identity, size_t identity_len, SSL_SESSION** sess) {
  *sess = nullptr;
  if (identity_len != sizeof kPskIdentity - 1 || std::memcmp(identity, kPskIdentity, identity_len) != 0)
    return 1;  // not ours: no PSK, and with no certificate either the handshake fails
  *sess = psk_session(ssl, context_of(ssl)->psk());
  return *sess != nullptr ? 1 : 0;
}

// OpenSSL writes to the socket with write(2), which raises SIGPIPE on a connection the peer
// reset; the plaintext paths use MSG_NOSIGNAL. A library must not change the process's signal
// handling, so SIGPIPE is blocked in this thread while OpenSSL may write, and one it raised is
// taken before it is unblocked: the write then fails with EPIPE, as send(MSG_NOSIGNAL) does.
class NoSigpipe {
 public:
  NoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    was_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~NoSigpipe() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
        const int saved = errno;
        timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
        errno = saved;
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  NoSigpipe(const NoSigpipe&) = delete;
  NoSigpipe& operator=(const NoSigpipe&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

}  // namespace

std::string psk_from_secret(const std::string& secret, const std::string& context) {
  std::string msg = "libcomm tls psk";
  msg.push_back('\0');
  msg += context;
  unsigned char out[32];
  unsigned int len = sizeof out;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), out, &len);
  std::string key(reinterpret_cast<const char*>(out), len);
  OPENSSL_cleanse(out, sizeof out);
  return key;
}

Config::~Config() { OPENSSL_cleanse(psk.data(), psk.size()); }

Status enabled_from_env(bool* enabled) {
  int64_t on = 0;
  COMM_RETURN_IF_ERROR(params::get_int("COMM_TLS", &on));
  *enabled = on != 0;
  return Status::Ok();
}

Status config_from_env(const std::string& secret, const std::string& context, const std::string& what_secret,
                       Config* out) {
  *out = Config{};
  COMM_RETURN_IF_ERROR(params::get_string("COMM_TLS_CERT", &out->cert_path));
  COMM_RETURN_IF_ERROR(params::get_string("COMM_TLS_KEY", &out->key_path));
  COMM_RETURN_IF_ERROR(params::get_string("COMM_TLS_CA", &out->ca_path));
  const bool any = !out->cert_path.empty() || !out->key_path.empty() || !out->ca_path.empty();
  if (any) {
    if (out->cert_path.empty() || out->key_path.empty() || out->ca_path.empty())
      return InvalidArgument("COMM_TLS=1 with certificates needs all of COMM_TLS_CERT, COMM_TLS_KEY and COMM_TLS_CA "
                             "(set: " + std::string(out->cert_path.empty() ? "" : "COMM_TLS_CERT ") +
                             (out->key_path.empty() ? "" : "COMM_TLS_KEY ") + (out->ca_path.empty() ? "" : "COMM_TLS_CA") +
                             ")");
    return Status::Ok();
  }
  if (secret.empty())
    return InvalidArgument("COMM_TLS=1 needs a key: set " + what_secret +
                           " (the pre-shared key is derived from it) or COMM_TLS_CERT, COMM_TLS_KEY and COMM_TLS_CA");
  out->psk = psk_from_secret(secret, context);
  return Status::Ok();
}

Status context_from_env(bool enabled, const std::string& secret, const std::string& context,
                        const std::string& what_secret, std::shared_ptr<Context>* out) {
  out->reset();
  if (!enabled) return Status::Ok();
  Config config;
  COMM_RETURN_IF_ERROR(config_from_env(secret, context, what_secret, &config));
  return Context::create(config, out);
}

Status Context::create(const Config& config, std::shared_ptr<Context>* out) {
  std::shared_ptr<Context> c(new Context());
  ERR_clear_error();
  c->ctx_ = SSL_CTX_new(TLS_method());
  if (c->ctx_ == nullptr) return SystemError("TLS: SSL_CTX_new failed: " + openssl_errors());
  SSL_CTX* ctx = c->ctx_;
  SSL_CTX_set_app_data(ctx, c.get());
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
  // No tickets: every connection authenticates afresh, and no post-handshake message arrives
  // in the middle of the data path's frames.
  SSL_CTX_set_num_tickets(ctx, 0);
  // A peer that is killed closes without close_notify: that is a close (the callers name the
  // peer), not a TLS error; frames carry their own lengths, so truncation is still seen.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_TICKET);
  // A write returns after each record that went out, like send(2) on a full socket buffer.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  c->engine_ = config.engine;
  if (kernel_tls_available(nullptr)) {
    // Kernel TLS only here: a context whose sessions seal libcomm's records must never let OpenSSL
    // hand the same keys to the kernel (a kernel that gained TLS after the probe would seal the
    // same sequence numbers again).
    SSL_CTX_set_options(ctx, SSL_OP_ENABLE_KTLS);
  } else {
    // Read ahead: one recv(2) takes several records at once instead of two per record (header,
    // then body); what it takes beyond the caller's bytes is pending() (and poll() does not see
    // it). Kernel receive needs it off.
    SSL_CTX_set_read_ahead(ctx, 1);
    SSL_CTX_set_default_read_buffer_len(ctx, 128 * 1024);
    // And the records are libcomm's after the handshake (tls/records.h): OpenSSL hands over the
    // application traffic secrets through its key log callback, which writes them nowhere else.
    if (!config.openssl_records) {
      c->own_records_ = true;
      SSL_CTX_set_keylog_callback(ctx, &Session::keylog);
    }
  }
  SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
  if (!config.psk.empty()) {
    c->psk_ = config.psk;
    SSL_CTX_set_psk_use_session_callback(ctx, use_psk);
    SSL_CTX_set_psk_find_session_callback(ctx, find_psk);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);  // the key is the authentication
  } else {
    if (SSL_CTX_use_certificate_chain_file(ctx, config.cert_path.c_str()) != 1)
      return InvalidArgument("TLS: cannot use COMM_TLS_CERT=" + config.cert_path + ": " + openssl_errors());
    if (SSL_CTX_use_PrivateKey_file(ctx, config.key_path.c_str(), SSL_FILETYPE_PEM) != 1)
      return InvalidArgument("TLS: cannot use COMM_TLS_KEY=" + config.key_path + ": " + openssl_errors());
    if (SSL_CTX_check_private_key(ctx) != 1)
      return InvalidArgument("TLS: COMM_TLS_KEY=" + config.key_path + " is not the key of COMM_TLS_CERT=" +
                             config.cert_path + ": " + openssl_errors());
    if (SSL_CTX_load_verify_locations(ctx, config.ca_path.c_str(), nullptr) != 1)
      return InvalidArgument("TLS: cannot read COMM_TLS_CA=" + config.ca_path + ": " + openssl_errors());
    // Both ends present a certificate the CA signed: the client checks the server's, the
    // server asks for and checks the client's. Peers are named by address, not by host name:
    // the CA is the cluster's, and what it signed is trusted.
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  *out = std::move(c);
  return Status::Ok();
}

Context::~Context() {
  SSL_CTX_free(ctx_);
  OPENSSL_cleanse(psk_.data(), psk_.size());
}

bool Session::pretend_kernel_send = false;

Status Session::create(std::shared_ptr<Context> ctx, int fd, Role role, std::unique_ptr<Session>* out) {
  std::unique_ptr<Session> s(new Session());
  ERR_clear_error();
  s->ssl_ = SSL_new(ctx->get());
  if (s->ssl_ == nullptr || SSL_set_fd(s->ssl_, fd) != 1)
    return SystemError("TLS: cannot start a session: " + openssl_errors());
  s->ctx_ = std::move(ctx);
  s->role_ = role;
  s->fork_generation_ = posix::fork_generation();
  SSL_set_app_data(s->ssl_, s.get());  // for keylog()
  if (role == Role::kClient) SSL_set_connect_state(s->ssl_);
  else SSL_set_accept_state(s->ssl_);
  *out = std::move(s);
  return Status::Ok();
}

Session::~Session() {
  // A graceful end says so (section 6.1): the peer then tells it from a cut stream. Never blocks,
  // never after a failure, never in a forked child (the parent still owns the connection).
  if (!forked()) {
    if (records_) {
      records_->close_notify();
    } else if (ssl_ != nullptr && SSL_is_init_finished(ssl_) == 1 && !failed_ && !write_held_) {
      NoSigpipe no_sigpipe;
      ERR_clear_error();
      (void)SSL_shutdown(ssl_);
      ERR_clear_error();
    }
  }
  records_.reset();
  SSL_free(ssl_);
  OPENSSL_cleanse(client_secret_.data(), client_secret_.size());
  OPENSSL_cleanse(server_secret_.data(), server_secret_.size());
}

void Session::keylog(const SSL* ssl, const char* line) {
  auto* s = static_cast<Session*>(SSL_get_app_data(ssl));
  if (s == nullptr || !s->ctx_->own_records()) return;
  // "CLIENT_TRAFFIC_SECRET_0 <client random, hex> <secret, hex>" (NSS's key log format).
  std::string* to = nullptr;
  const char* p = line;
  if (std::strncmp(p, "CLIENT_TRAFFIC_SECRET_0 ", 24) == 0) to = &s->client_secret_;
  else if (std::strncmp(p, "SERVER_TRAFFIC_SECRET_0 ", 24) == 0) to = &s->server_secret_;
  if (to == nullptr) return;
  p = std::strchr(p + 24, ' ');
  if (p == nullptr) return;
  ++p;
  OPENSSL_cleanse(to->data(), to->size());
  to->clear();
  to->reserve(64);  // no reallocation while it fills: no freed copy of the secret left unwiped
  auto hex = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
  for (; p[0] != '\0' && p[1] != '\0'; p += 2) to->push_back(static_cast<char>(hex(p[0]) << 4 | hex(p[1])));
}

// After the handshake: the records become libcomm's where the context says so, the cipher is the
// one records.cc seals with, and OpenSSL holds no bytes it read past the handshake (none come:
// the side that finishes first waits for the other's first record; else OpenSSL keeps them).
// Our records start both directions at sequence 0 under the first application keys, which holds
// only while OpenSSL has sent nothing under them: no tickets (SSL_CTX_set_num_tickets(ctx, 0)
// above), no key update (a reused nonce would break AES-GCM outright).
void Session::take_records() {
  const SSL_CIPHER* cipher = SSL_get_current_cipher(ssl_);
  const bool kernel = kernel_send() || kernel_recv();
  if (kernel && ctx_->own_records())
    COMM_WARN(kNet, "TLS: the kernel took this connection's records after the handshake although libcomm asked "
              "for none; libcomm leaves them to the kernel (never two sealers under one key)");
  const bool eligible = !records_ && !kernel && ctx_->own_records() && cipher != nullptr &&
                        (SSL_CIPHER_get_id(cipher) & 0xffff) == 0x1301 && SSL_has_pending(ssl_) == 0 &&
                        SSL_get_num_tickets(ssl_) == 0 && SSL_get_key_update_type(ssl_) == SSL_KEY_UPDATE_NONE &&
                        client_secret_.size() == 32 && server_secret_.size() == 32;
  const bool client = role_ == Role::kClient;
  std::string why;
  if (eligible) {
    records_ = Records::create(SSL_get_fd(ssl_), client, client ? client_secret_ : server_secret_,
                               client ? server_secret_ : client_secret_, &why, ctx_->engine());
    if (!records_) COMM_WARN(kNet, "%s; OpenSSL keeps the records", why.c_str());
  }
  // Wiped on every path: OpenSSL keeps its own copy where it keeps the records.
  OPENSSL_cleanse(client_secret_.data(), client_secret_.size());
  OPENSSL_cleanse(server_secret_.data(), server_secret_.size());
  client_secret_.clear();
  server_secret_.clear();
}

ssize_t Session::records_result(ssize_t r) {
  if (r < 0 && errno != EAGAIN && !records_->why().empty()) why_ = records_->why();
  return r;
}

ssize_t Session::fail(int ret, const char* what) {
  const int saved = errno;
  const int err = SSL_get_error(ssl_, ret);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
    errno = EAGAIN;
    return -1;
  }
  if (err == SSL_ERROR_ZERO_RETURN) return 0;
  failed_ = true;  // OpenSSL sends nothing more on this session (no close_notify)
  if (err == SSL_ERROR_SYSCALL) {
    ERR_clear_error();
    if (saved == 0) return 0;  // end of file without close_notify: the peer closed
    errno = saved;
    return -1;
  }
  why_ = std::string("TLS ") + what + " failed: " + openssl_errors();
  errno = EPROTO;
  return -1;
}

bool Session::forked() const { return fork_generation_ != posix::fork_generation(); }

// A session used in a process forked after it was made: refused before a byte is sealed.
static ssize_t refuse_forked(std::string* why) {
  *why = "TLS: this connection was made before the process forked; a child must not use it (its sequence numbers "
         "would seal under nonces the parent uses)";
  errno = EPROTO;
  return -1;
}

Step Session::handshake() {
  NoSigpipe no_sigpipe;
  ERR_clear_error();
  errno = 0;
  const int r = SSL_do_handshake(ssl_);
  if (r == 1) {
    take_records();
    return Step::kDone;
  }
  const int saved = errno;
  const int err = SSL_get_error(ssl_, r);
  if (err == SSL_ERROR_WANT_READ) return Step::kWantRead;
  if (err == SSL_ERROR_WANT_WRITE) return Step::kWantWrite;
  std::string detail = openssl_errors();
  if (err == SSL_ERROR_SYSCALL || err == SSL_ERROR_ZERO_RETURN || detail.empty())
    detail = saved != 0 ? errno_string(saved) : "the peer closed the connection";
  // A certificate's verdict, where one was checked: with a PSK, or before the peer's certificate
  // came, OpenSSL reports X509_V_ERR_UNSPECIFIED, which named a certificate where none was.
  const long verify = SSL_get_verify_result(ssl_);
  if (!ctx_->uses_psk() && verify != X509_V_OK && verify != X509_V_ERR_UNSPECIFIED)
    detail += " (" + std::string(X509_verify_cert_error_string(verify)) + ")";
  why_ = "TLS handshake failed: " + detail;
  return Step::kFailed;
}

int64_t Session::clock_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

Status Session::handshake_until(int64_t deadline_ms) {
  for (;;) {
    const Step step = handshake();
    if (step == Step::kDone) return Status::Ok();
    if (step == Step::kFailed) return SystemError(why_);
    const int64_t left = deadline_ms - clock_ms();
    if (left <= 0) return Timeout("TLS handshake: no answer in time (does the peer run COMM_TLS=1?)");
    pollfd p{SSL_get_fd(ssl_), static_cast<short>(step == Step::kWantRead ? POLLIN : POLLOUT), 0};
    if (::poll(&p, 1, static_cast<int>(left)) < 0 && errno != EINTR)
      return SystemError("TLS handshake: poll() failed: " + errno_string(errno));
  }
}

ssize_t Session::read(void* buf, size_t n) {
  if (forked()) return refuse_forked(&why_);
  if (records_) return records_result(records_->read(buf, n));
  NoSigpipe no_sigpipe;  // reading may answer (an alert, a key update)
  // Each SSL_read_ex hands out one record at most: go on until n bytes or nothing more is
  // there, as recv(2) does with what the socket holds.
  size_t total = 0;
  while (total < n) {
    ERR_clear_error();
    errno = 0;
    size_t got = 0;
    const int r = SSL_read_ex(ssl_, static_cast<char*>(buf) + total, n - total, &got);
    if (r == 1) {
      total += got;
      continue;
    }
    if (total > 0) break;  // what failed (would block, closed, broken) shows at the next call
    return fail(r, "read");
  }
  return static_cast<ssize_t>(total);
}

ssize_t Session::write(const void* buf, size_t n) {
  // With partial writes each SSL_write_ex seals and sends one record (16 KiB at most): go on
  // until the socket is full, as send(2) does, so the caller's loop runs once per buffer-full,
  // not once per record. After a would-block the retry starts at the byte that blocked, which
  // is what OpenSSL asks (the same buffer for the record it holds).
  if (forked()) return refuse_forked(&why_);
  if (records_) {
    const iovec iov{const_cast<void*>(buf), n};
    return records_result(records_->writev(&iov, 1));
  }
  NoSigpipe no_sigpipe;
  write_held_ = false;
  size_t total = 0;
  while (total < n) {
    ERR_clear_error();
    errno = 0;
    size_t put = 0;
    const int r = SSL_write_ex(ssl_, static_cast<const char*>(buf) + total, n - total, &put);
    if (r == 1) {
      total += put;
      // OpenSSL 3.0 never updates a key by itself: as records.cc does, move both ends' keys long
      // before AES-GCM's limit of 2^24.5 records per key (RFC 8446 section 5.5), counted in
      // records, as a receiver counts them: each call sealed at least one, one per 16 KiB.
      records_under_key_ += std::max<uint64_t>(1, (put + 16383) / 16384);
      if (records_under_key_ >= Records::records_per_key && !cannot_rekey_) {
        // Asked right after a write that went out whole, so the KeyUpdate leads the next write.
        if (SSL_key_update(ssl_, SSL_KEY_UPDATE_REQUESTED) == 1) {
          records_under_key_ = 0;
        } else if (kernel_send()) {
          // A kernel that seals but cannot rekey (before Linux 6.x's TLS 1.3 key updates): the
          // peer warns past the limit; failing the job would not make this kernel rekey.
          cannot_rekey_ = true;
          COMM_WARN(kNet, "TLS: kernel TLS cannot update this connection's key (%s); going on under one key",
                    openssl_errors().c_str());
        } else {
          why_ = "TLS write failed: the key update failed: " + openssl_errors();
          errno = EPROTO;
          return -1;
        }
      }
      continue;
    }
    const ssize_t failed = fail(r, "write");
    write_held_ = failed < 0 && errno == EAGAIN;  // OpenSSL holds the record it began
    if (total > 0 && failed < 0 && errno == EAGAIN) break;
    return total > 0 && failed == 0 ? static_cast<ssize_t>(total) : failed;
  }
  return static_cast<ssize_t>(total);
}

ssize_t Session::writev(const iovec* iov, int n) {
  if (forked()) return refuse_forked(&why_);
  if (records_) return records_result(records_->writev(iov, n));
  size_t total = 0;
  for (int i = 0; i < n; ++i) {
    if (iov[i].iov_len == 0) continue;
    const ssize_t put = write(iov[i].iov_base, iov[i].iov_len);
    if (put < 0) {
      return total > 0 && errno == EAGAIN ? static_cast<ssize_t>(total) : -1;
    }
    total += static_cast<size_t>(put);
    if (static_cast<size_t>(put) < iov[i].iov_len) break;
  }
  return static_cast<ssize_t>(total);
}

bool Session::write_owed() const { return records_ ? records_->write_owed() : write_held_; }

bool Session::pending() const { return records_ ? records_->pending() : SSL_has_pending(ssl_) == 1; }

bool Session::kernel_send() const { return pretend_kernel_send || BIO_get_ktls_send(SSL_get_wbio(ssl_)) == 1; }

bool Session::peer_over_key_limit() const { return records_ && records_->peer_over_key_limit(); }

bool Session::peer_closed_cleanly() const {
  return records_ ? records_->peer_closed_cleanly() : (SSL_get_shutdown(ssl_) & SSL_RECEIVED_SHUTDOWN) != 0;
}

bool Session::kernel_recv() const { return BIO_get_ktls_recv(SSL_get_rbio(ssl_)) == 1; }

std::string Session::describe() const {
  std::string text = std::string(SSL_get_version(ssl_)) + " " + SSL_get_cipher_name(ssl_);
  text += ctx_->uses_psk() ? ", PSK" : ", certificates";
  if (records_) {
    text += ", libcomm's records (no kernel TLS)";
  } else {
    text += kernel_send() ? ", kernel send" : ", user-space send";
    text += kernel_recv() ? ", kernel receive" : ", user-space receive";
  }
  return text;
}

ssize_t recv_some(Session* tls, int fd, void* buf, size_t n) {
  return tls != nullptr ? tls->read(buf, n) : ::recv(fd, buf, n, MSG_DONTWAIT);
}

ssize_t send_some(Session* tls, int fd, const void* buf, size_t n) {
  return tls != nullptr ? tls->write(buf, n) : ::send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

bool kernel_tls_available(std::string* why) {
  static std::once_flag once;
  static bool available = false;
  static std::string found;
  std::call_once(once, [] {
    if (::access("/proc/net/tls_stat", F_OK) == 0) {
      available = true;
      found = "/proc/net/tls_stat exists (the tls module is loaded)";
      return;
    }
    // The probe: a loopback connection and the upper-layer protocol on it.
    posix::Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    posix::Fd client(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (!listener.valid() || !client.valid() || ::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        ::listen(listener.get(), 1) != 0 || ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
        ::connect(client.get(), reinterpret_cast<sockaddr*>(&a), len) != 0) {
      found = "could not probe (" + errno_string(errno) + ")";
      return;
    }
    if (::setsockopt(client.get(), SOL_TCP, TCP_ULP, "tls", 3) == 0) {
      available = true;
      found = "TCP_ULP \"tls\" accepted";
    } else {
      found = "no /proc/net/tls_stat and TCP_ULP \"tls\" refused (" + errno_string(errno) +
              "): the kernel has no tls module (CONFIG_TLS)";
    }
  });
  if (why != nullptr) *why = found;
  return available;
}

}  // namespace comm::tls

// TLS 1.3 over an already connected, non-blocking TCP socket, through OpenSSL's libssl
// (COMM_TLS, docs/design/base.md "Encryption in transit"). One wrapper for the two users: the TCP
// store and the socket transport. Both run their own libcomm handshake first (proof of the
// secret, world size, ...), then a TLS handshake on the same descriptor, then every byte as TLS
// records.
//
// Authentication is mutual either way:
// - a pre-shared key (TLS 1.3 external PSK, no certificates): both ends derive it from a secret
//   they already share (psk_from_secret) -- COMM_AUTH_TOKEN for the store, the job secret for
//   the socket transport; a peer with another key fails the handshake;
// - certificates (COMM_TLS_CERT, COMM_TLS_KEY, COMM_TLS_CA): each end presents its certificate
//   and checks the peer's against the CA; a peer without one, or with one the CA did not sign,
//   is refused.
//
// Kernel TLS: where the kernel has the "tls" module the context asks for it (SSL_OP_ENABLE_KTLS)
// and OpenSSL hands the record keys to the kernel after the handshake. Elsewhere OpenSSL makes the
// handshake and libcomm seals and opens the records (tls/records.h: no copies but the cipher's,
// many records per system call), as the kernel would; such a context never asks for kernel TLS,
// and the handover is refused where the kernel took either direction all the same (two sealers
// under one key would reuse AES-GCM's nonces). OpenSSL's records remain for a session whose cipher
// is not TLS_AES_128_GCM_SHA256. Every sender of ours updates its key by records sent (records.h).
// A session made before a fork is refused in the child (its sequence numbers are the parent's).
// A session closes with close_notify (destructor), so a peer tells a close from a cut stream.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <memory>
#include <string>

#include "status.h"
#include "tls/gcm.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace comm::tls {

class Records;

struct Config {
  ~Config();  // wipes the PSK
  // PSK mode: the key (psk_from_secret). Empty: certificate mode (the three paths below).
  std::string psk;
  std::string cert_path;  // COMM_TLS_CERT: this end's certificate chain (PEM)
  std::string key_path;   // COMM_TLS_KEY: its private key (PEM)
  std::string ca_path;    // COMM_TLS_CA: what signs every peer's certificate (PEM file)
  // OpenSSL's records even where libcomm would seal its own (tls/records.h): for tests, as a peer
  // with kernel TLS or an older libcomm sends them.
  bool openssl_records = false;
  // The AES-GCM of libcomm's records (tls/gcm.h): the process's choice unless a test forces one.
  gcm::Engine engine = gcm::chosen_engine();
};

// The PSK of a protocol: HMAC-SHA256(secret, "libcomm tls psk" | 0 | context). The context
// ("store", "socket") makes the store's key and the data path's key different.
std::string psk_from_secret(const std::string& secret, const std::string& context);
// The data path's context, for the core (which never spells a transport's name,
// tests/project/test_layers.py): the PSK label the socket transport's connections have always used.
inline constexpr const char* kDataPathContext = "socket";

// COMM_TLS (0 or 1).
Status enabled_from_env(bool* enabled);
// What COMM_TLS_CERT, COMM_TLS_KEY and COMM_TLS_CA ask for, for `secret`'s protocol: certificates
// when any is set (then all three must be), else a PSK from `secret`, which must then not be
// empty (`what_secret` names it in the message).
Status config_from_env(const std::string& secret, const std::string& context, const std::string& what_secret,
                       Config* out);

class Context;
// config_from_env and Context::create when enabled; *out null when not.
Status context_from_env(bool enabled, const std::string& secret, const std::string& context,
                        const std::string& what_secret, std::shared_ptr<Context>* out);

class Context {
 public:
  static Status create(const Config& config, std::shared_ptr<Context>* out);
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  SSL_CTX* get() const { return ctx_; }
  ~Context();  // also wipes the PSK
  bool uses_psk() const { return !psk_.empty(); }
  const std::string& psk() const { return psk_; }
  // Sessions seal and open their own records after the handshake (no kernel TLS here).
  bool own_records() const { return own_records_; }
  gcm::Engine engine() const { return engine_; }

 private:
  Context() = default;
  SSL_CTX* ctx_ = nullptr;
  std::string psk_;
  bool own_records_ = false;
  gcm::Engine engine_ = gcm::Engine::kOpenSsl;
};

enum class Role { kClient, kServer };
enum class Step { kDone, kWantRead, kWantWrite, kFailed };

class Session {
 public:
  // fd stays owned by the caller and must outlive the session.
  static Status create(std::shared_ptr<Context> ctx, int fd, Role role, std::unique_ptr<Session>* out);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // One non-blocking step of the handshake. kFailed: why() says what (the peer's alert, a bad
  // certificate, "the peer closed the connection").
  Step handshake();
  // The handshake to its end, polling the descriptor until `deadline_ms` (a CLOCK_MONOTONIC
  // time in ms, clock_ms()) -- for the blocking store client.
  Status handshake_until(int64_t deadline_ms);
  static int64_t clock_ms();

  // recv(2)/send(2) semantics, so a caller's byte loop stays as it was: > 0 bytes; 0 the peer
  // closed; -1 with errno EAGAIN (call again with the same arguments when the socket is ready),
  // or another errno (ECONNRESET, EPIPE, EPROTO for a TLS error: why() says which).
  ssize_t read(void* buf, size_t n);
  ssize_t write(const void* buf, size_t n);
  // The iovecs in order, each as records; stops at the first that would block (after > 0 bytes,
  // the count so far). A retry after EAGAIN must start at the same byte, as with write().
  ssize_t writev(const iovec* iov, int n);
  // A write stopped (would block) after sealing bytes it did not count, however many it counted:
  // the next call must begin with those bytes. Unlike send(2), a write that counted 0 bytes may
  // have put part of them on the wire, so a caller must not send something else first (the
  // socket transport's failure report waits for the frame in progress: mid_frame).
  bool write_owed() const;
  // Bytes already read from the socket and held here: poll() would not report them.
  bool pending() const;
  // Whether the kernel seals (send) / opens (receive) this session's records.
  bool kernel_send() const;
  bool kernel_recv() const;
  // Tests: kernel_send() answers yes (a kernel that took the sends after the handshake).
  static bool pretend_kernel_send;
  // The peer's close_notify came: the stream ended where it meant to (not cut).
  bool peer_closed_cleanly() const;
  // libcomm's records: the peer sent more than AES-GCM's limit under one key (warned once).
  bool peer_over_key_limit() const;
  // Whether libcomm seals and opens them (tls/records.h), after the handshake.
  bool own_records() const { return records_ != nullptr; }
  const std::string& why() const { return why_; }
  // "TLSv1.3 TLS_AES_128_GCM_SHA256, PSK, kernel send" -- for log lines.
  std::string describe() const;
  // OpenSSL's key log callback (Context::create): keeps the application traffic secrets for the
  // records (tls/records.h); not for callers.
  static void keylog(const SSL* ssl, const char* line);

 private:
  Session() = default;
  ssize_t fail(int ret, const char* what);
  ssize_t records_result(ssize_t r);
  void take_records();
  std::shared_ptr<Context> ctx_;
  SSL* ssl_ = nullptr;
  Role role_ = Role::kClient;
  std::string why_;
  std::string client_secret_, server_secret_;
  bool forked() const;
  bool still_our_socket() const;  // the descriptor is still the socket the session was made on
  dev_t socket_dev_ = 0;
  ino_t socket_ino_ = 0;
  // OpenSSL's records: records sent since the last key update (write() updates after
  // Records::records_per_key of them, as records.cc does: a receiver counts records, not bytes).
  uint64_t records_under_key_ = 0;
  bool cannot_rekey_ = false;  // a key update failed where the kernel seals (warned once): not tried again
  bool write_held_ = false;  // OpenSSL's records: the last write would block mid-record (write_owed)
  bool failed_ = false;      // OpenSSL's records: a fatal error (no close_notify after it)
  uint64_t fork_generation_ = 0;
  std::unique_ptr<Records> records_;
};

// recv(2)/send(2) on fd, or the session's read/write when tls is not null: one line at a call site.
ssize_t recv_some(Session* tls, int fd, void* buf, size_t n);
ssize_t send_some(Session* tls, int fd, const void* buf, size_t n);

// Whether this kernel offers kernel TLS (the "tls" upper-layer protocol): /proc/net/tls_stat,
// else a probe (setsockopt TCP_ULP "tls" on a loopback connection, which loads the module where
// it is allowed). *why says what was found.
bool kernel_tls_available(std::string* why);

}  // namespace comm::tls

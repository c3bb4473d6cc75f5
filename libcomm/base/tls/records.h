// TLS 1.3 application records sealed and opened by libcomm after OpenSSL's handshake, where the
// kernel offers no TLS (tls/tls.h). What kernel TLS would do, in user space: a record is sealed
// from the caller's buffer straight into the bytes handed to send(2), and opened from what
// recv(2) read straight into the caller's buffer. OpenSSL's record layer (3.0) copies every
// record's plaintext into its own buffer before sealing it and out of its buffer after opening
// it, blocks SIGPIPE around each call (it writes with write(2)) and makes one write(2) per 16 KiB
// record; those were most of what TLS cost beyond the cipher (docs/benchmarks.md, "TLS against
// plaintext").
//
// The records are RFC 8446's (section 5.2): AES-128-GCM, the nonce the write IV XOR the record's
// sequence number, the record header as additional data, the content type after the plaintext,
// no padding sent (a peer's padding is accepted). The cipher is tls/aes_gcm_vaes.h where the CPU
// runs it (COMM_TLS_AES, records.cc), else OpenSSL's EVP: both give the same bytes. The keys come
// from the handshake's application traffic secrets (OpenSSL's key log callback: tls.cc), expanded
// as section 7.3 says. Before a key has sealed kRecordsPerKey records its sender sends a
// KeyUpdate and both ends move to the next secret (section 4.6.3), far below AES-GCM's limit
// of 2^24.5 records per key (section 5.5).
// Handshake messages after the handshake (KeyUpdate; NewSessionTicket to a client, unused) may
// be fragmented across records or coalesced in one (section 5.1): tls/handshake_messages.h
// reassembles them, and application data inside a fragmented message is an error.
// Alerts: close_notify reads as a close (and so does every later read), any other alert as
// EPROTO naming it. A failure is for good: no record after one that failed is ever read.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tls/aes_gcm_vaes.h"
#include "tls/handshake_messages.h"

typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;

namespace comm::tls {

class Records {
 public:
  // tx/rx: this end's and the peer's application traffic secrets (32 bytes, SHA-256).
  // client: this end is the TLS client (only a client accepts a NewSessionTicket).
  static std::unique_ptr<Records> create(int fd, bool client, const std::string& tx_secret,
                                         const std::string& rx_secret, std::string* why);
  ~Records();
  Records(const Records&) = delete;
  Records& operator=(const Records&) = delete;

  // Session::read / writev's semantics (tls.h): recv(2)/send(2)'s, a retry after EAGAIN starts at
  // the same byte. A record sent in part is finished first at the next call and counted then, so
  // that call must offer the bytes it was sealed from again, at the same addresses (however its
  // iovecs cut them): else -1, EINVAL, why() says so, and nothing is sent (a correct retry may
  // follow).
  ssize_t read(void* buf, size_t n);
  ssize_t writev(const iovec* iov, int n);
  bool pending() const { return plain_off_ < plain_len_ || whole_record_held(); }
  // Records sealed from bytes not counted yet: the next writev must offer them first (tls.h).
  bool write_owed() const { return owed_ > 0; }
  const std::string& why() const { return why_; }

  // After this many records under one key the sender updates it (tests lower it).
  static uint64_t records_per_key;

 private:
  struct Direction {
    std::string secret;
    EVP_CIPHER_CTX* ctx = nullptr;
    gcm::Key vaes;  // the same key for tls/aes_gcm_vaes.h, set where that code runs (vaes_)
    uint8_t iv[12] = {};
    uint64_t seq = 0;
  };
  Records() = default;
  bool set_key(Direction* d, const std::string& secret);
  bool next_key(Direction* d);
  size_t seal(uint8_t type, const iovec* iov, int n, size_t skip, size_t len, uint8_t* out);
  ssize_t open_one(uint8_t* dst, size_t room);
  ssize_t check_header();
  bool whole_record_held() const;
  ssize_t fail(const std::string& what);
  ssize_t handshake_record(const uint8_t* content, size_t n);
  void remember_owed(const iovec* iov, int n, size_t skip);
  bool owed_offered_again(const iovec* iov, int n) const;
  friend struct RecordsTestAccess;  // tests/base/test_tls.cc: records of any content type

  int fd_ = -1;
  bool vaes_ = false;  // seal and open with tls/aes_gcm_vaes.h, not OpenSSL's EVP (create says when)
  Direction tx_, rx_;
  std::string why_;
  bool broken_ = false;  // a record failed to open, an alert came, or the cipher failed: for good
  bool closed_ = false;  // the peer's close_notify came
  bool ask_peer_update_ = false;  // the peer's key is near its limit: the next KeyUpdate asks it to move
  // Sending: sealed records not yet taken by the kernel. Only the first may have gone in part
  // (out_sent_ of its bytes); owed_ is its plaintext length, counted once it is all out.
  std::vector<uint8_t> out_;  // its first out_len_ bytes
  size_t out_len_ = 0;
  size_t out_sent_ = 0;
  size_t owed_ = 0;
  // Where owed_'s plaintext was sealed from: its runs of contiguous addresses, in order (how the
  // caller's iovecs cut them does not matter). A retry must offer the same (writev). Compared only,
  // never read through.
  struct Run {
    const uint8_t* base;
    size_t len;
  };
  std::vector<Run> owed_from_;
  bool key_update_due_ = false;
  // Receiving: what recv(2) read, from in_off_; an opened record's plaintext not yet handed out.
  std::vector<uint8_t> in_;
  size_t in_off_ = 0, in_len_ = 0;
  std::vector<uint8_t> plain_;  // its first plain_len_ bytes
  size_t plain_len_ = 0;
  size_t plain_off_ = 0;
  HandshakeMessages handshake_{false};  // messages after the handshake, across records (its client flag: create)
};

}  // namespace comm::tls

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
// no padding sent (a peer's padding is accepted, and never written past the count handed out). The
// cipher is tls/gcm.h's (ipsec-mb or OpenSSL's EVP: the same bytes). The keys come from the
// handshake's application traffic secrets (OpenSSL's key log callback: tls.cc), expanded as
// section 7.3 says. Before a key has sealed records_per_key records its sender sends a KeyUpdate
// and both ends move to the next secret (section 4.6.3), far below AES-GCM's limit of 2^24.5
// records per key (section 5.5). A peer whose sender keeps a key longer (kernel TLS on a kernel
// that cannot rekey) is warned about, not failed: the limit is its sender's to keep.
// Handshake messages after the handshake (KeyUpdate; NewSessionTicket to a client, unused) may
// be fragmented across records or coalesced in one (section 5.1): tls/handshake_messages.h
// reassembles them, and application data inside a fragmented message is an error.
// Alerts: close_notify reads as a close (and so does every later read), any other alert as
// EPROTO naming it; this end sends close_notify when it closes (close_notify()) and a fatal alert
// before it fails on what the peer sent (bad_record_mac, record_overflow, unexpected_message,
// decode_error). A failure is for good: no record after one that failed is ever read.
// A process forked after the records were made must not use them (its copy of the sequence
// numbers would seal again under nonces its parent uses): every call there fails.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tls/gcm.h"
#include "tls/handshake_messages.h"

namespace comm::tls {

class Records {
 public:
  // tx/rx: this end's and the peer's application traffic secrets (32 bytes, SHA-256).
  // client: this end is the TLS client (only a client accepts a NewSessionTicket).
  // engine: whose AES-GCM (tls/gcm.h; the process's choice unless a test or a context asks).
  static std::unique_ptr<Records> create(int fd, bool client, const std::string& tx_secret,
                                         const std::string& rx_secret, std::string* why,
                                         gcm::Engine engine = gcm::chosen_engine());
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
  gcm::Engine engine() const { return tx_.cipher->engine(); }
  // The peer's close_notify came: the stream ended where it meant to, not cut.
  bool peer_closed_cleanly() const { return closed_; }
  // The peer has sent more than max_records_per_key records under one key (warned once).
  bool peer_over_key_limit() const { return warned_key_limit_; }
  // Sends close_notify where the stream is between records (best effort, never blocks); nothing
  // after a failure or in a forked child.
  void close_notify();

  // After this many records under one key a sender of ours updates it (OpenSSL's records too:
  // tls.cc), and a receiver asks its peer to (tests lower it).
  static uint64_t records_per_key;
  // AES-GCM's limit (RFC 8446 section 5.5); a peer past it is warned about (tests lower it).
  static uint64_t max_records_per_key;

 private:
  struct Direction {
    std::string secret;
    std::unique_ptr<gcm::Cipher> cipher;
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
  // alert: the fatal alert sent to the peer first (0: none, as for the peer's own alert).
  ssize_t fail(const std::string& what, uint8_t alert = 0);
  void send_alert(uint8_t level, uint8_t description);
  bool forked() const;
  ssize_t handshake_record(const uint8_t* content, size_t n);
  void remember_owed(const iovec* iov, int n, size_t skip);
  bool owed_offered_again(const iovec* iov, int n) const;
  friend struct RecordsTestAccess;  // tests/base/tls_test_support.h: records of any content type

  int fd_ = -1;
  uint64_t fork_generation_ = 0;  // the process's (base/posix/fork_generation.h) when made
  Direction tx_, rx_;
  std::string why_;
  bool broken_ = false;  // a record failed to open, an alert came, or the cipher failed: for good
  bool closed_ = false;  // the peer's close_notify came
  bool sent_close_ = false;  // ours went (or a fatal alert): nothing more is sent
  bool warned_key_limit_ = false;
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

#include "tls/records.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"
#include "posix/fork_generation.h"

namespace comm::tls {
namespace {

constexpr size_t kHeader = 5;
constexpr size_t kTag = 16;
constexpr size_t kMaxPlain = 16384;                      // 2^14, section 5.1
constexpr size_t kMaxCipher = kMaxPlain + 256;           // what a peer may send, section 5.2
constexpr size_t kSealed = kHeader + kMaxPlain + 1 + kTag;  // the largest record sealed here
// Sealed per round before send(2): 256 KiB of plaintext, one system call.
constexpr size_t kBatch = 16;
// recv(2) takes up to this much at once (many records per call).
constexpr size_t kInBytes = 256 * 1024 + kHeader + kMaxCipher;
constexpr uint8_t kAppData = 23, kAlert = 21, kHandshake = 22;
constexpr uint8_t kKeyUpdate = 24;
// Alerts (section 6): their levels and the descriptions sent here.
constexpr uint8_t kWarning = 1, kFatal = 2;
constexpr uint8_t kCloseNotify = 0, kUnexpectedMessage = 10, kBadRecordMac = 20, kRecordOverflow = 22,
                  kInternalError = 80;

// HKDF-Expand-Label(secret, label, "", len) with SHA-256 (RFC 8446 section 7.1); len <= 32.
// Empty if HMAC fails (the callers then fail: never a key from uninitialised bytes).
std::string expand_label(const std::string& secret, const std::string& label, size_t len) {
  std::string info;
  info.push_back(static_cast<char>(len >> 8));
  info.push_back(static_cast<char>(len & 0xff));
  const std::string full = "tls13 " + label;
  info.push_back(static_cast<char>(full.size()));
  info += full;
  info.push_back('\0');  // no context
  info.push_back('\1');  // HKDF-Expand's block counter: one block is enough
  unsigned char out[32];
  unsigned int out_len = sizeof out;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(info.data()), info.size(), out, &out_len) == nullptr ||
      out_len < len)
    return {};
  std::string key(reinterpret_cast<const char*>(out), len);
  OPENSSL_cleanse(out, sizeof out);
  return key;
}

void nonce_of(const uint8_t iv[12], uint64_t seq, uint8_t out[12]) {
  std::memcpy(out, iv, 12);
  for (int i = 0; i < 8; ++i) out[4 + i] ^= static_cast<uint8_t>(seq >> (56 - 8 * i));
}

size_t be16(const uint8_t* p) { return static_cast<size_t>(p[0]) << 8 | p[1]; }

// take(bytes, count) for each contiguous span of the `len` bytes of the iovecs from byte `skip` on:
// the one walk sealing (either cipher) and the retry check's bookkeeping share.
template <class Take>
void for_each_span(const iovec* iov, int n, size_t skip, size_t len, Take take) {
  for (int i = 0; i < n && len > 0; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    const size_t k = std::min(len, iov[i].iov_len - skip);
    take(static_cast<const uint8_t*>(iov[i].iov_base) + skip, k);
    len -= k;
    skip = 0;
  }
}

// Says once per process which AES-GCM code seals and opens the records (COMM_DEBUG=INFO).
void say_engine_once() {
  static const bool said = [] {
    std::string why;
    gcm::chosen_engine(&why);
    COMM_LOG(kInfo, kNet, "TLS records: AES-128-GCM by %s", why.c_str());
    return true;
  }();
  (void)said;
}

}  // namespace

uint64_t Records::records_per_key = uint64_t{1} << 23;
uint64_t Records::max_records_per_key = 23726566;  // 2^24.5

std::unique_ptr<Records> Records::create(int fd, bool client, const std::string& tx_secret,
                                         const std::string& rx_secret, std::string* why, gcm::Engine engine) {
  say_engine_once();
  std::unique_ptr<Records> r(new Records());
  r->fd_ = fd;
  r->fork_generation_ = posix::fork_generation();
  r->handshake_ = HandshakeMessages(client);
  r->tx_.cipher = gcm::Cipher::create(engine);
  r->rx_.cipher = gcm::Cipher::create(engine);
  if (!r->tx_.cipher || !r->rx_.cipher || !r->set_key(&r->tx_, tx_secret) || !r->set_key(&r->rx_, rx_secret)) {
    *why = std::string("TLS: cannot set up AES-128-GCM (") + gcm::engine_name(engine) + ") for the records";
    return nullptr;
  }
  // Buffers grow with what a connection carries (a store connection's frames are small, a data
  // connection's are not), and never shrink: a vector's resize zero-fills what it adds, which on
  // every batch was 6 % of the CPU in memset.
  r->in_.resize(4096);
  return r;
}

Records::~Records() {
  OPENSSL_cleanse(tx_.secret.data(), tx_.secret.size());
  OPENSSL_cleanse(rx_.secret.data(), rx_.secret.size());
  // The ciphers wipe their keys; the plaintext held for the caller goes too.
  OPENSSL_cleanse(plain_.data(), plain_.size());
}

bool Records::forked() const { return fork_generation_ != posix::fork_generation(); }

bool Records::set_key(Direction* d, const std::string& secret) {
  if (secret.size() != 32) return false;
  OPENSSL_cleanse(d->secret.data(), d->secret.size());
  d->secret = secret;
  std::string key = expand_label(secret, "key", 16);
  std::string iv = expand_label(secret, "iv", 12);
  const bool ok = key.size() == 16 && iv.size() == 12 &&
                  d->cipher->set_key(reinterpret_cast<const uint8_t*>(key.data()));
  if (ok) std::memcpy(d->iv, iv.data(), sizeof d->iv);
  OPENSSL_cleanse(key.data(), key.size());
  OPENSSL_cleanse(iv.data(), iv.size());
  d->seq = 0;
  return ok;
}

// RFC 8446 section 7.2: application_traffic_secret_N+1.
bool Records::next_key(Direction* d) {
  std::string next = expand_label(d->secret, "traffic upd", 32);
  const bool ok = set_key(d, next);
  OPENSSL_cleanse(next.data(), next.size());
  return ok;
}

// A failure is for good: every later read and write returns it, so no record after one that
// failed to open (or an alert) is ever taken as the next one.
ssize_t Records::fail(const std::string& what, uint8_t alert) {
  if (!broken_) {
    why_ = "TLS " + what;
    if (alert != 0) send_alert(kFatal, alert);  // the peer learns why before the connection goes
  }
  broken_ = true;
  errno = EPROTO;
  return -1;
}

// One alert record, sent where the stream is between records and the socket takes it at once:
// it must never block, nor cut into a record part sent (the peer would read garbage instead).
void Records::send_alert(uint8_t level, uint8_t description) {
  if (sent_close_ || forked() || out_sent_ != out_len_) return;
  sent_close_ = true;
  const uint8_t alert[2] = {level, description};
  const iovec iov{const_cast<uint8_t*>(alert), sizeof alert};
  uint8_t record[kHeader + sizeof alert + 1 + kTag];
  const size_t n = seal(kAlert, &iov, 1, 0, sizeof alert, record);
  if (n > 0) (void)!::send(fd_, record, n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void Records::close_notify() {
  if (!broken_) send_alert(kWarning, kCloseNotify);
}

// One record: `len` bytes of the iovecs from byte `skip` on, then the content type, sealed into
// out (header, ciphertext, tag). Returns its size on the wire.
// 0 if the cipher fails.
size_t Records::seal(uint8_t type, const iovec* iov, int n, size_t skip, size_t len, uint8_t* out) {
  const size_t inner = len + 1;
  out[0] = kAppData;  // every TLS 1.3 record says application_data outside
  out[1] = 0x03;
  out[2] = 0x03;
  out[3] = static_cast<uint8_t>((inner + kTag) >> 8);
  out[4] = static_cast<uint8_t>((inner + kTag) & 0xff);
  uint8_t nonce[12];
  nonce_of(tx_.iv, tx_.seq++, nonce);
  // Straight from each iovec into out: no gather copy (the cipher carries a block cut by an
  // iovec's end over to the next).
  gcm::Cipher& c = *tx_.cipher;
  bool ok = c.begin(nonce, out, kHeader);
  uint8_t* at = out + kHeader;
  for_each_span(iov, n, skip, len, [&](const uint8_t* p, size_t k) {
    ok = ok && c.encrypt(p, at, k);
    at += k;
  });
  ok = ok && c.encrypt(&type, at, 1) && c.seal_tag(at + 1);
  return ok ? kHeader + inner + kTag : 0;
}

ssize_t Records::writev(const iovec* iov, int n) {
  if (broken_) return fail("");
  if (forked()) return fail("write: this connection was made before the process forked; a child must not use it "
                            "(its sequence numbers would seal under nonces the parent uses)");
  if (sent_close_) {
    why_ = "TLS write after this end's close_notify";
    errno = EPIPE;
    return -1;
  }
  size_t total = 0;
  for (int i = 0; i < n; ++i) total += iov[i].iov_len;
  if (owed_ > total) {  // records sealed from bytes this call does not offer again
    why_ = "TLS write: a retry offered fewer bytes than the last call sealed";
    errno = EINVAL;
    return -1;
  }
  if (owed_ > 0 && !owed_offered_again(iov, n)) {
    why_ = "TLS write: a retry offered other memory than the bytes the last call sealed and began to send "
           "(send(2)'s contract: the same bytes again)";
    errno = EINVAL;
    return -1;
  }
  size_t done = 0;  // plaintext of this call's bytes now taken by the kernel, sealed
  for (;;) {
    // What was sealed goes first; its plaintext counts once all of it is out.
    while (out_sent_ < out_len_) {
      const ssize_t k = ::send(fd_, out_.data() + out_sent_, out_len_ - out_sent_, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        out_sent_ += static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (done > 0) return static_cast<ssize_t>(done);  // would block, or broke: the next call says
      return -1;                                        // errno: send(2)'s
    }
    done += owed_;
    owed_ = 0;
    out_len_ = 0;
    out_sent_ = 0;
    if (done >= total) return static_cast<ssize_t>(done);
    // Seal the next batch straight from the caller's bytes.
    const size_t bytes = std::min(kBatch * kMaxPlain, total - done);
    const size_t need = bytes + (bytes / kMaxPlain + 2) * (kHeader + 1 + kTag) + 8;  // + a KeyUpdate
    if (out_.size() < need) out_.resize(need);
    size_t at = 0;
    if (key_update_due_ || ask_peer_update_ || tx_.seq >= records_per_key) {
      // The KeyUpdate goes under the old key, the records after it under the new one. With
      // update_requested the peer moves its own key too (its records under one key near the
      // limit: a peer on OpenSSL's records never updates unasked) -- but never in the answer to
      // the peer's request (section 4.6.3), which moved the peer's key already.
      const bool request = ask_peer_update_ && !key_update_due_;
      const uint8_t msg[5] = {kKeyUpdate, 0, 0, 1, request ? uint8_t{1} : uint8_t{0}};
      const iovec m{const_cast<uint8_t*>(msg), sizeof msg};
      const size_t sealed = seal(kHandshake, &m, 1, 0, sizeof msg, out_.data());
      if (sealed == 0 || !next_key(&tx_)) return fail("write: the key update failed", kInternalError);
      at += sealed;
      key_update_due_ = false;
      ask_peer_update_ = false;
    }
    for (size_t r = 0; r < kBatch && done + owed_ < total && tx_.seq < records_per_key; ++r) {
      const size_t len = std::min(kMaxPlain, total - done - owed_);
      const size_t sealed = seal(kAppData, iov, n, done + owed_, len, out_.data() + at);
      if (sealed == 0) return fail("write: the cipher failed to seal a record", kInternalError);
      at += sealed;
      owed_ += len;
    }
    remember_owed(iov, n, done);
    out_len_ = at;
  }
}

// owed_ bytes from byte `skip` of the iovecs were just sealed: remember their addresses.
void Records::remember_owed(const iovec* iov, int n, size_t skip) {
  owed_from_.clear();  // keeps its capacity
  for_each_span(iov, n, skip, owed_, [&](const uint8_t* p, size_t k) {
    if (!owed_from_.empty() && owed_from_.back().base + owed_from_.back().len == p) owed_from_.back().len += k;
    else owed_from_.push_back(Run{p, k});
  });
}

// Whether the first owed_ bytes of the iovecs (total >= owed_) lie where the records still going
// out were sealed from. Addresses only, no look at the bytes: a caller that rewrote the memory in
// between is not caught (nor is it by send(2)), one that offers another buffer is.
bool Records::owed_offered_again(const iovec* iov, int n) const {
  size_t run = 0, in_run = 0, left = owed_;
  for (int i = 0; i < n && left > 0; ++i) {
    const auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
    size_t len = std::min(left, iov[i].iov_len);
    while (len > 0) {
      if (run == owed_from_.size() || p != owed_from_[run].base + in_run) return false;
      const size_t k = std::min(len, owed_from_[run].len - in_run);
      p += k;
      len -= k;
      left -= k;
      in_run += k;
      if (in_run == owed_from_[run].len) {
        ++run;
        in_run = 0;
      }
    }
  }
  return left == 0;
}

bool Records::whole_record_held() const {
  return in_len_ >= kHeader && in_len_ >= kHeader + be16(in_.data() + in_off_ + 3);
}

// Opens the record at in_off_ (whole_record_held()). Application data goes straight to dst when
// room holds it, else to plain_. Returns the bytes put at dst, 0 for none; -1 with errno EPROTO
// (why_) for a record that does not authenticate or an alert; -2 for the peer's close_notify.
// The header of the record at in_off_ (kHeader bytes held), checked before its body arrives.
ssize_t Records::check_header() {
  const uint8_t* rec = in_.data() + in_off_;
  const size_t len = be16(rec + 3);
  if (rec[0] != kAppData || rec[1] != 0x03 || rec[2] != 0x03)
    return fail("read: not a TLS 1.3 record (garbage on the connection?)", kUnexpectedMessage);
  // Section 5.2 and 5.4: the content, its type byte and the tag; AES-GCM adds nothing else.
  if (len < kTag + 1 || len > kMaxPlain + 1 + kTag)
    return fail("read: a record of " + std::to_string(len) + " bytes (record_overflow)", kRecordOverflow);
  return 0;
}

ssize_t Records::open_one(uint8_t* dst, size_t room) {
  if (check_header() < 0) return -1;
  const uint8_t* rec = in_.data() + in_off_;
  const size_t len = be16(rec + 3);
  const size_t inner = len - kTag;
  // A peer must update its key before AES-GCM's limit (section 5.5): ask it at records_per_key
  // (with our next write: a peer on OpenSSL's records never updates unasked). Past the limit the
  // fault is its sender's (kernel TLS that cannot rekey updates never): warned about, not failed.
  if (rx_.seq == records_per_key) ask_peer_update_ = true;
  if (rx_.seq >= max_records_per_key && !warned_key_limit_) {
    warned_key_limit_ = true;
    COMM_WARN(kNet,
              "TLS: the peer has sent %llu records under one key without updating it, past AES-GCM's limit "
              "(RFC 8446 section 5.5); its sender cannot rekey (kernel TLS on a kernel without TLS key updates?). "
              "Going on; upgrade that host's kernel or run it without kernel TLS",
              static_cast<unsigned long long>(rx_.seq));
  }
  uint8_t nonce[12];
  nonce_of(rx_.iv, rx_.seq++, nonce);
  // Straight into the caller's buffer only what is certainly its data: a record whose last byte is
  // the application-data type has no padding (section 5.4) and its content fills exactly the count
  // returned. The last byte is decrypted alone first to know (unauthenticated: it only chooses
  // where to open); padding, a handshake message or an alert go to plain_, never past the count.
  uint8_t peek = 0;
  if (!rx_.cipher->peek_byte(nonce, inner - 1, rec[kHeader + inner - 1], &peek))
    return fail("read: the cipher failed", kInternalError);
  const bool direct = peek == kAppData && room >= inner - 1;
  uint8_t* out = dst;
  if (!direct) {
    if (plain_.size() < inner) plain_.resize(inner);
    out = plain_.data();
  }
  // Decrypted into out before the tag is checked (as every streaming GCM does): on a mismatch
  // below out is wiped and the record refused, so no unauthenticated byte is handed out.
  uint8_t last = 0;
  gcm::Cipher& c = *rx_.cipher;
  const bool authentic = c.begin(nonce, rec, kHeader) && c.decrypt(rec + kHeader, out, inner - 1) &&
                         c.decrypt(rec + kHeader + inner - 1, &last, 1) && c.open_tag(rec + kHeader + inner);
  in_off_ += kHeader + len;
  in_len_ -= kHeader + len;
  if (in_len_ == 0) in_off_ = 0;
  if (!authentic) {
    // Nothing unauthenticated stays in the caller's buffer (or ours).
    OPENSSL_cleanse(out, inner - 1);
    plain_len_ = 0;
    return fail("read failed: a record does not authenticate (bad record mac): altered in transit, or another key",
                kBadRecordMac);
  }
  // The content type is the last byte that is not padding (section 5.4).
  size_t content = inner - 1;
  uint8_t type = last;
  while (type == 0 && content > 0) type = out[--content];
  if (type == 0) return fail("read: a record with no content type", kUnexpectedMessage);
  // Section 5.1: nothing between the records of a fragmented handshake message. An alert is
  // still read as one, so that the peer's reason is named (a close_notify ends the stream there).
  if (type != kHandshake && type != kAlert && handshake_.mid_message()) {
    OPENSSL_cleanse(out, content);
    plain_len_ = 0;
    return fail("read: a record of content type " + std::to_string(type) +
                    " between the fragments of a handshake message (RFC 8446 section 5.1, unexpected_message)",
                kUnexpectedMessage);
  }
  if (type == kAppData) {
    if (direct) return static_cast<ssize_t>(content);  // == inner - 1: no padding (the peek)
    plain_len_ = content;  // read() hands it out from plain_off_
    plain_off_ = 0;
    return 0;
  }
  plain_len_ = 0;
  if (type == kHandshake) {
    const ssize_t r = handshake_record(out, content);
    OPENSSL_cleanse(out, content);
    return r;
  }
  uint8_t alert[2] = {0, 0};
  if (content == 2) std::memcpy(alert, out, 2);
  OPENSSL_cleanse(out, content);
  if (type == kAlert) {
    if (content == 2 && alert[1] == 0) return -2;  // close_notify
    return fail("read failed: the peer sent TLS alert " + std::to_string(alert[1]));
  }
  return fail("read: an unexpected record of content type " + std::to_string(type) + " after the handshake",
              kUnexpectedMessage);
}

// One record's handshake messages (tls/handshake_messages.h): a KeyUpdate that ends it moves the
// peer's key for the records after it.
ssize_t Records::handshake_record(const uint8_t* content, size_t n) {
  HandshakeMessages::Outcome got;
  std::string why;
  if (!handshake_.take(content, n, &got, &why)) return fail(why, got.alert);
  if (got.key_update) {
    if (!next_key(&rx_)) return fail("read: the key update failed", kInternalError);
    ask_peer_update_ = false;  // the peer's key just moved
    if (got.update_requested) key_update_due_ = true;  // ours goes with the next write
  }
  return 0;
}

ssize_t Records::read(void* buf, size_t n) {
  if (broken_) return fail("");
  if (forked()) return fail("read: this connection was made before the process forked; a child must not use it");
  if (closed_) return 0;  // after close_notify nothing more is read (section 6.1)
  auto* dst = static_cast<uint8_t*>(buf);
  size_t total = 0;
  while (total < n) {
    if (plain_off_ < plain_len_) {
      const size_t k = std::min(n - total, plain_len_ - plain_off_);
      std::memcpy(dst + total, plain_.data() + plain_off_, k);
      total += k;
      plain_off_ += k;
      if (plain_off_ == plain_len_) {  // all handed out: no copy of the caller's data stays here
        OPENSSL_cleanse(plain_.data(), plain_len_);
        plain_off_ = plain_len_ = 0;
      }
      continue;
    }
    if (whole_record_held()) {
      const ssize_t got = open_one(dst + total, n - total);
      if (got == -2) {  // close_notify: a close, after what came
        closed_ = true;
        return static_cast<ssize_t>(total);
      }
      // The bytes before the failure are authentic and handed out; the failure is the next call's.
      if (got < 0) return total > 0 ? static_cast<ssize_t>(total) : -1;
      total += static_cast<size_t>(got);
      continue;
    }
    if (total > 0) break;  // recv(2) hands out what is there
    if (in_len_ >= kHeader && check_header() < 0) return -1;  // not waiting for a bad record's body
    if (in_off_ > 0 && in_.size() - in_off_ - in_len_ < kHeader + kMaxCipher) {
      std::memmove(in_.data(), in_.data() + in_off_, in_len_);  // the start of one record
      in_off_ = 0;
    }
    if (in_off_ + in_len_ == in_.size()) in_.resize(kInBytes);  // never a recv of 0 bytes (it reads as a close)
    const ssize_t k = ::recv(fd_, in_.data() + in_off_ + in_len_, in_.size() - in_off_ - in_len_, MSG_DONTWAIT);
    if (k > 0) {
      // A recv that filled the buffer: a connection that carries data; room for the largest record,
      // then for 256 KiB at once.
      if (in_off_ + in_len_ + static_cast<size_t>(k) == in_.size() && in_.size() < kInBytes)
        in_.resize(in_.size() < kHeader + kMaxCipher ? kHeader + kMaxCipher : kInBytes);
      in_len_ += static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return 0;  // the peer closed (a record cut short reads as a close: frames carry lengths)
    if (errno == EINTR) continue;
    return -1;
  }
  return static_cast<ssize_t>(total);
}

}  // namespace comm::tls

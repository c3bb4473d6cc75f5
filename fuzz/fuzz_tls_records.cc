// Fuzz target: libcomm's TLS 1.3 record layer (libcomm/base/tls/records.h) reading what a peer
// sent. A record that does not authenticate is refused before any of its bytes are looked at, so
// mutated ciphertext would reach no further than the tag: the input is plaintext records instead,
// sealed here under a fixed test key (the sender's side of the same class) and written to one end
// of a socket pair, and comm::tls::Records reads them at the other end, in reads of many sizes.
// Some chunks go on the wire unsealed, so that the header checks and garbage are reached too.
//
// Input: a settings byte, then chunks [kind][length: 2 bytes, big-endian][content].
//   settings bit 0: the receiver is the TLS client (it takes a NewSessionTicket);
//   bit 1: the sender shuts its end after the last byte (the reader ends on a close, else on EAGAIN);
//   bits 2-7: which read sizes, in which order (kReadSizes).
//   kind with bit 7 set: the content goes on the wire as it is; else it is sealed as one record of
//   content type `kind` (0: the type is the content's last byte that is not zero, the zeros after
//   it are padding). A length past the input's end takes what is left.
//
// Checked, against what a receiver must do with the records (RFC 8446 section 5, records.h):
// a read never returns more than it was asked for; after a read fails (-1, EPROTO) every later one
// fails too, and after a close every later read is a close; the bytes handed out are exactly the
// application data sealed before the first record refused (or the close_notify, or the first
// unsealed byte); a refused record fails the read, never reads as a close; records that all open
// end on a close or EAGAIN, never a failure.
// Reached: Records::read and all it calls (header checks, opening, padding, alerts, KeyUpdates,
// the plaintext buffer), with the AES-GCM engine create() picks (COMM_TLS_CIPHER, tls/gcm.h): where
// ipsec-mb runs, run it once more with COMM_TLS_CIPHER=openssl to fuzz the opening with OpenSSL's
// EVP. Not reached: the
// sending side (writev), which only ever seals our own bytes.
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "posix/fd.h"
#include "tls/handshake_messages.h"
#include "tls/records.h"

namespace comm::tls {
// Records' test friend (records.h), the same shape as tests/base/tls_test_support.h's: a separate binary.
struct RecordsTestAccess {
  // One record of `type` holding the n bytes at p, under the sender's current key and sequence number.
  static std::vector<uint8_t> seal(Records& r, uint8_t type, const uint8_t* p, size_t n) {
    std::vector<uint8_t> out(n + 64);
    const iovec iov{const_cast<uint8_t*>(p), n};
    const size_t k = r.seal(type, &iov, 1, 0, n, out.data());
    FUZZ_CHECK(k > 0);
    out.resize(k);
    return out;
  }
  // What the sender does after sealing a KeyUpdate: its next records go under the next secret.
  static void next_send_key(Records& r) { FUZZ_CHECK(r.next_key(&r.tx_)); }
};
}  // namespace comm::tls

namespace {

using comm::tls::HandshakeMessages;
using comm::tls::Records;
using comm::tls::RecordsTestAccess;

constexpr uint8_t kAlert = 21, kHandshake = 22, kAppData = 23;
constexpr size_t kMaxPlain = 16384;  // RFC 8446 section 5.1: a longer record is refused at its header
constexpr size_t kMaxChunk = kMaxPlain + 600;  // past the limit, and the header's length still fits 16 bits
constexpr size_t kMaxWire = 256 * 1024;        // bytes sent per input
// Reads of one byte (everything through the plaintext buffer), small, around one record, many.
constexpr size_t kReadSizes[] = {1, 2, 5, 16, 300, 4096, 16383, 16384, 16385, 65543};
constexpr size_t kSizes = sizeof kReadSizes / sizeof kReadSizes[0];
// Whether a read leaves the caller's bytes past its count as they were (or zeros where a record
// that failed to authenticate was wiped): records.cc opens only unpadded application data outside
// a fragmented handshake message in the caller's buffer (issue 33; 7 of the 11 seeds failed this).
constexpr bool kCheckPastCount = true;

enum class End { kNone, kClose, kRefused, kGarbage };  // what the first unread chunk is, for a correct reader

struct Wire {
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> expected;  // application data a correct reader hands out
  End end = End::kNone;
};

// What a receiver must make of one sealed record of `type` holding `content`: its application data
// goes to w->expected, a refusal or a close_notify ends what it reads. `shadow` follows the
// receiver's handshake messages; true: the record was a KeyUpdate (the sender moves its key).
bool predict(uint8_t type, const uint8_t* content, size_t n, HandshakeMessages* shadow, Wire* w) {
  if (n + 1 > kMaxPlain + 1) {  // section 5.2 (record_overflow, at the header)
    w->end = End::kRefused;
    return false;
  }
  // Section 5.4: the type is the last byte that is not zero; before it, the content.
  std::vector<uint8_t> inner(content, content + n);
  inner.push_back(type);
  while (!inner.empty() && inner.back() == 0) inner.pop_back();
  if (inner.empty()) {
    w->end = End::kRefused;
    return false;
  }
  const uint8_t t = inner.back();
  inner.pop_back();
  // Section 5.1: nothing but handshake records between a message's fragments (an alert is still read).
  if (t != kHandshake && t != kAlert && shadow->mid_message()) {
    w->end = End::kRefused;
    return false;
  }
  if (t == kAppData) {
    w->expected.insert(w->expected.end(), inner.begin(), inner.end());
    return false;
  }
  if (t == kHandshake) {
    HandshakeMessages::Outcome out;
    std::string why;
    if (!shadow->take(inner.data(), inner.size(), &out, &why)) {
      w->end = End::kRefused;
      return false;
    }
    return out.key_update;
  }
  w->end = t == kAlert && inner.size() == 2 && inner[1] == 0 ? End::kClose : End::kRefused;
  return false;
}

// The input's chunks as the bytes on the wire, sealed by `sender`.
Wire make_wire(const uint8_t* data, size_t size, bool receiver_client, Records* sender) {
  Wire w;
  HandshakeMessages shadow(receiver_client);
  size_t at = 1;
  while (at < size) {
    const uint8_t kind = data[at++];
    size_t len = 0;
    for (int i = 0; i < 2 && at < size; ++i) len = len << 8 | data[at++];
    len = std::min({len, size - at, kMaxChunk});
    const uint8_t* content = data + at;
    at += len;
    std::vector<uint8_t> rec;
    bool key_update = false;
    if (kind & 0x80) {
      rec.assign(content, content + len);
      // No record ever authenticates from bytes the key never sealed: reading stops here.
      if (len > 0 && w.end == End::kNone) w.end = End::kGarbage;
    } else {
      rec = RecordsTestAccess::seal(*sender, kind, content, len);
      if (w.end == End::kNone) key_update = predict(kind, content, len, &shadow, &w);
    }
    if (w.bytes.size() + rec.size() > kMaxWire) {
      if (w.end == End::kNone) w.end = End::kGarbage;  // not sent: unknown where reading stops
      break;
    }
    w.bytes.insert(w.bytes.end(), rec.begin(), rec.end());
    if (key_update) RecordsTestAccess::next_send_key(*sender);
  }
  return w;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool receiver_client = data[0] & 1;
  const bool shut = data[0] & 2;
  const size_t schedule = data[0] >> 2;
  const size_t stride = 1 + schedule % 7;

  int sv[2];
  FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
  comm::posix::Fd a(sv[0]), b(sv[1]);
  const std::string one(32, '\x11'), two(32, '\x22');  // the fixed test secrets
  std::string why;
  const std::unique_ptr<Records> sender = Records::create(a.get(), !receiver_client, one, two, &why);
  const std::unique_ptr<Records> receiver = Records::create(b.get(), receiver_client, two, one, &why);
  FUZZ_CHECK(sender && receiver);
  const Wire w = make_wire(data, size, receiver_client, sender.get());

  // The wire goes out as the socket takes it, between reads: no send ever blocks.
  size_t sent = 0;
  auto pump = [&] {
    while (sent < w.bytes.size()) {
      const ssize_t k = ::send(a.get(), w.bytes.data() + sent, w.bytes.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) {
        sent += static_cast<size_t>(k);
      } else {
        FUZZ_CHECK(k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
        if (errno != EINTR) return;
      }
    }
    if (shut) ::shutdown(a.get(), SHUT_WR);
  };

  std::vector<uint8_t> got;
  bool failed = false, closed = false;
  for (size_t i = 0;; ++i) {
    pump();
    const size_t n = kReadSizes[(schedule + i * stride) % kSizes];
    std::vector<uint8_t> buf(n, 0xa5);  // exactly n: a write past the count asked for is past an allocation
    errno = 0;
    const ssize_t r = receiver->read(buf.data(), n);
    if (kCheckPastCount)
      for (size_t j = r > 0 ? static_cast<size_t>(r) : 0; j < n; ++j)  // or wiped, after a forged record
        FUZZ_CHECK(buf[j] == 0xa5 || (buf[j] == 0 && receiver->why().find("does not authenticate") != std::string::npos));
    if (r > 0) {
      FUZZ_CHECK(!failed && !closed);
      FUZZ_CHECK(static_cast<size_t>(r) <= n);
      got.insert(got.end(), buf.begin(), buf.begin() + r);
      continue;
    }
    if (r == 0) {
      FUZZ_CHECK(!failed);
      if (closed) break;  // a second read after the close: a close again
      closed = true;
      continue;
    }
    FUZZ_CHECK(r == -1);
    if (failed) {  // a second read after the failure: failed again
      FUZZ_CHECK(errno == EPROTO);
      break;
    }
    FUZZ_CHECK(!closed);
    if (errno == EPROTO) {
      failed = true;
      FUZZ_CHECK(!receiver->why().empty());
      continue;
    }
    FUZZ_CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
    FUZZ_CHECK(!(shut && sent == w.bytes.size()));  // the sender closed: its end reads as a close
    if (sent == w.bytes.size()) break;  // EAGAIN with nothing left: all is read
    // Else the read took all the socket held (part of a record): the next pump sends more.
  }

  FUZZ_CHECK(got == w.expected);
  switch (w.end) {
    case End::kRefused:
      FUZZ_CHECK(failed);
      break;
    case End::kClose:
      FUZZ_CHECK(closed);
      break;
    case End::kNone:
      FUZZ_CHECK(!failed && closed == shut);
      break;
    case End::kGarbage:
      break;
  }
  return 0;
}

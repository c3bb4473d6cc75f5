// Fuzz target: the handshake messages a TLS 1.3 peer sends after the handshake, reassembled from
// the records that carry them (comm::tls::HandshakeMessages, libcomm/base/tls/handshake_messages.h).
// The input is cut into records, and the same records go to a client's instance and a server's
// (only a client takes a NewSessionTicket), each as libcomm's record layer feeds it
// (tls/records.cc): once take() refuses a record the connection is broken, and nothing more is fed.
//
// Input: records, each [n < 128][n bytes] or [0x80 | anything][length: 2 bytes, big-endian][filler
// byte] (a record of `length` copies of the filler: a small input still makes a 64 KiB ticket).
// A length past the input's end takes what is left.
//
// Checked, against a model that walks the same bytes message by message as RFC 8446 (sections
// 4.6 and 5.1) and the header say: a record is refused exactly when the model finds a message the
// header does not accept (or the record is empty); a KeyUpdate outcome only when a whole 5-byte
// KeyUpdate (24, length 1, asking 0 or 1) ended the record, and always then, update_requested as it
// asks; a refused record moves no key; part of a message is held (mid_message) exactly when the
// model holds one, and what the model holds never exceeds kMaxMessage + 4 bytes.
// HandshakeMessages shows not how many bytes it holds, only whether it holds some: the size
// itself is the model's, and its match with the parser's rests on the parser refusing at a header.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "tls/handshake_messages.h"

namespace {

using comm::tls::HandshakeMessages;

constexpr uint8_t kNewSessionTicket = 4, kKeyUpdate = 24;
constexpr size_t kMaxFed = 256 * 1024;  // bytes per input, to keep an execution short

// The messages walked one after the other, the way the RFC describes them: a 4-byte header (type, 24-bit
// length), then the body.
class Model {
 public:
  explicit Model(bool client) : client_(client) {}

  struct Verdict {
    bool ok = true;
    bool key_update = false;
    bool update_requested = false;
  };

  Verdict take(const uint8_t* p, size_t n) {
    Verdict v;
    if (n == 0) return Verdict{false};  // section 5.1: no zero-length handshake fragment
    for (size_t i = 0; i < n;) {
      if (msg_.size() < 4) {
        msg_.push_back(p[i++]);
        if (msg_.size() < 4) continue;
        // The header: a message that will be refused is refused here.
        const bool known = type() == kKeyUpdate || (type() == kNewSessionTicket && client_);
        if (!known || len() > HandshakeMessages::kMaxMessage || (type() == kKeyUpdate && len() != 1))
          return Verdict{false};
      } else {  // the body, as much of it as this record holds
        const size_t k = std::min(4 + len() - msg_.size(), n - i);
        msg_.insert(msg_.end(), p + i, p + i + k);
        i += k;
      }
      if (msg_.size() < 4 + len()) continue;
      if (type() == kKeyUpdate) {
        // Section 4.6.3: update_not_requested (0) or update_requested (1); the key changes at the
        // record's end, so nothing may follow in the record (section 5.1).
        if (msg_[4] > 1 || i != n) return Verdict{false};
        v.key_update = true;
        v.update_requested = msg_[4] == 1;
      }
      msg_.clear();
    }
    return v;
  }
  size_t held() const { return msg_.size(); }

 private:
  uint8_t type() const { return msg_[0]; }
  size_t len() const { return size_t{msg_[1]} << 16 | size_t{msg_[2]} << 8 | msg_[3]; }

  bool client_;
  std::vector<uint8_t> msg_;  // the message not yet whole
};

struct End {
  HandshakeMessages parser;
  Model model;
  bool broken = false;
  std::vector<uint8_t> last5;  // the last 5 bytes fed, across records

  explicit End(bool client) : parser(client), model(client) {}

  void feed(const std::vector<uint8_t>& rec) {
    if (broken) return;  // take() refused a record: the caller stops (tls/records.cc)
    HandshakeMessages::Outcome out;
    out.key_update = out.update_requested = true;  // take() must set both
    std::string why;
    const bool ok = parser.take(rec.data(), rec.size(), &out, &why);
    const Model::Verdict v = model.take(rec.data(), rec.size());
    FUZZ_CHECK(ok == v.ok);
    last5.insert(last5.end(), rec.end() - static_cast<std::ptrdiff_t>(std::min<size_t>(rec.size(), 5)), rec.end());
    if (last5.size() > 5) last5.erase(last5.begin(), last5.end() - 5);
    if (!ok) {
      FUZZ_CHECK(!why.empty());
      FUZZ_CHECK(!out.key_update && !out.update_requested);  // a refused record moves no key
      broken = true;
      return;
    }
    FUZZ_CHECK(out.key_update == v.key_update);
    FUZZ_CHECK(out.update_requested == (out.key_update && v.update_requested));
    if (out.key_update) {  // a whole KeyUpdate ended the record
      FUZZ_CHECK(model.held() == 0 && last5.size() == 5);
      FUZZ_CHECK(last5[0] == kKeyUpdate && last5[1] == 0 && last5[2] == 0 && last5[3] == 1 && last5[4] <= 1);
      FUZZ_CHECK(out.update_requested == (last5[4] == 1));
    }
    FUZZ_CHECK(parser.mid_message() == (model.held() > 0));
    FUZZ_CHECK(model.held() <= HandshakeMessages::kMaxMessage + 4);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  End client(true), server(false);
  size_t at = 0, fed = 0;
  std::vector<uint8_t> rec;
  while (at < size && fed < kMaxFed) {
    const uint8_t ctl = data[at++];
    if (ctl & 0x80) {
      size_t len = 0;
      for (int i = 0; i < 2 && at < size; ++i) len = len << 8 | data[at++];
      const uint8_t fill = at < size ? data[at++] : 0;
      rec.assign(len, fill);
    } else {
      const size_t len = std::min<size_t>(ctl, size - at);
      rec.assign(data + at, data + at + len);
      at += len;
    }
    fed += rec.size();
    client.feed(rec);
    server.feed(rec);
    if (client.broken && server.broken) break;
  }
  return 0;
}

// The handshake messages a TLS 1.3 peer may send after the handshake (RFC 8446 section 4.6),
// reassembled from the records that carry them (tls/records.h). Section 5.1: handshake messages
// may be coalesced into one record or fragmented across several; each is a 4-byte header (type,
// 24-bit length) and its body. Accepted here: KeyUpdate (section 4.6.3), which must be the last
// message of its record (the key changes at the record's end), and, on a client, NewSessionTicket
// (section 4.6.1), not used (libcomm resumes nothing). Anything else, a message longer than
// kMaxMessage, or a KeyUpdate followed by more handshake bytes in its record is an error.
// Parsing only: the caller moves the key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace comm::tls {

class HandshakeMessages {
 public:
  // RFC 8446 lets a NewSessionTicket reach ~128 KiB (a ticket and extensions of up to 2^16 bytes
  // each); real ones are a few hundred bytes and a KeyUpdate is 5. A message that declares more
  // than this is refused at its header, before its bytes are held.
  static constexpr size_t kMaxMessage = 64 * 1024;

  // The alerts (section 6.2) a refusal names, for the caller to send.
  static constexpr uint8_t kUnexpectedMessageAlert = 10, kIllegalParameterAlert = 47, kDecodeErrorAlert = 50;

  struct Outcome {
    bool key_update = false;        // a whole KeyUpdate ended this record: move the peer's key now
    bool update_requested = false;  // ... with update_requested: this end updates its own too
    uint8_t alert = 0;              // take() refused: the alert to send
  };

  explicit HandshakeMessages(bool client) : client_(client) {}

  // One record's handshake content. false: *why says what (the caller fails for good).
  bool take(const uint8_t* p, size_t n, Outcome* out, std::string* why);
  // Part of a message is held: the next record must be a handshake record (section 5.1).
  bool mid_message() const { return !held_.empty(); }

 private:
  bool client_;
  std::vector<uint8_t> held_;  // the start of a message not yet whole (never a whole one)
};

}  // namespace comm::tls

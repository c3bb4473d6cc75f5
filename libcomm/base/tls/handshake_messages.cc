#include "tls/handshake_messages.h"

namespace comm::tls {
namespace {

constexpr uint8_t kNewSessionTicket = 4;
constexpr uint8_t kKeyUpdate = 24;
constexpr size_t kMessageHeader = 4;

}  // namespace

bool HandshakeMessages::take(const uint8_t* p, size_t n, Outcome* out, std::string* why) {
  *out = Outcome{};
  out->alert = kUnexpectedMessageAlert;
  if (n == 0) {  // section 5.1: never a zero-length handshake fragment
    *why = "read: an empty handshake record (RFC 8446 section 5.1, unexpected_message)";
    return false;
  }
  held_.insert(held_.end(), p, p + n);
  size_t at = 0;  // the next message in held_
  while (held_.size() - at >= kMessageHeader) {
    const uint8_t* m = held_.data() + at;
    const uint8_t type = m[0];
    const size_t len = size_t{m[1]} << 16 | size_t{m[2]} << 8 | m[3];
    // Judged at the header: nothing is held for a message that will be refused.
    if (type != kKeyUpdate && !(type == kNewSessionTicket && client_)) {
      *why = "read: an unexpected handshake message of type " + std::to_string(type) + " after the handshake" +
             (type == kNewSessionTicket ? " (a NewSessionTicket sent to the server)" : "");
      return false;
    }
    if (len > kMaxMessage) {
      out->alert = kDecodeErrorAlert;
      *why = "read: a handshake message of type " + std::to_string(type) + " declares " + std::to_string(len) +
             " bytes, more than the " + std::to_string(kMaxMessage) + " accepted after the handshake";
      return false;
    }
    if (type == kKeyUpdate && len != 1) {
      out->alert = kDecodeErrorAlert;
      *why = "read: a KeyUpdate of " + std::to_string(len) + " bytes (RFC 8446 section 4.6.3, decode_error)";
      return false;
    }
    if (held_.size() - at - kMessageHeader < len) break;  // the rest comes in the next record(s)
    const uint8_t* body = m + kMessageHeader;
    at += kMessageHeader + len;
    if (type == kNewSessionTicket) continue;  // a server's ticket to this client: not used (no resumption)
    if (body[0] > 1) {
      out->alert = kIllegalParameterAlert;
      *why = "read: a KeyUpdate asking " + std::to_string(body[0]) + " (RFC 8446 section 4.6.3, illegal_parameter)";
      return false;
    }
    // Section 5.1: a KeyUpdate ends its record; the records after it come under the new key. Every
    // byte after a message that became whole here is this record's.
    if (at != held_.size()) {
      *why = "read: a KeyUpdate followed by more handshake bytes in its record (RFC 8446 section 5.1, "
             "unexpected_message)";
      return false;
    }
    out->key_update = true;
    out->update_requested = body[0] == 1;
  }
  held_.erase(held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(at));
  return true;
}

}  // namespace comm::tls

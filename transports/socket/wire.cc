// The checks of what arrives on the wire, as pure functions of the bytes, so that the fuzz
// targets (fuzz/fuzz_socket_wire.cc) exercise exactly what progress.cc and mesh.cc run.
#include "socket/wire.h"

#include "transport.h"

namespace comm::transport::sock {

std::string frame_problem(const FrameHeader& h) {
  if (h.magic != kFrameMagic) return "bad magic " + std::to_string(h.magic);
  switch (static_cast<FrameKind>(h.kind)) {
    case FrameKind::kError:
      if (h.length > kMaxErrorText) return "error text of " + std::to_string(h.length) + " bytes";
      return "";
    case FrameKind::kHeartbeat:
    case FrameKind::kGoodbye:
      if (h.length != 0) return "a " + std::to_string(h.length) + "-byte heartbeat or goodbye";
      return "";
    case FrameKind::kData:
      break;
    default:
      return "unknown kind " + std::to_string(h.kind);
  }
  if (h.coll < static_cast<uint8_t>(CollKind::kAllreduce) || h.coll > static_cast<uint8_t>(CollKind::kInternal))
    return "unknown collective " + std::to_string(h.coll);
  if (h.offset > h.total_bytes || h.length > h.total_bytes - h.offset)
    return "part at offset " + std::to_string(h.offset) + " of " + std::to_string(h.length) +
           " bytes lies outside its " + std::to_string(h.total_bytes) + "-byte message";
  return "";
}

std::string hello_problem(const Hello& h) {
  if (h.magic != kHelloMagic) return "sent garbage (bad handshake magic; not a libcomm peer?)";
  if (h.version != kProtocolVersion)
    return "speaks wire protocol version " + std::to_string(h.version) + ", this rank " +
           std::to_string(kProtocolVersion);
  if ((h.flags & ~kHelloTls) != 0) return "sent garbage (handshake flags " + std::to_string(h.flags) + ")";
  if (h.reserved != 0) return "sent garbage (handshake reserved field " + std::to_string(h.reserved) + ")";
  return "";
}

}  // namespace comm::transport::sock

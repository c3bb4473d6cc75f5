// Fuzz target: what the socket transport reads from a peer (transports/socket/wire.h): the
// handshake's Hello (hello_problem, as mesh.cc checks it), its Proof (check_proof), the Reply
// and the bytes its code announces, and frame headers (frame_problem, as
// progress.cc checks each before it indexes anything), then the striping arithmetic a DATA
// frame is matched against. Checked: an accepted header's part lies inside its message, an
// accepted ERROR text fits its buffer, stripes cover a message exactly.
#include <cstdint>
#include <cstring>

#include "fuzz_check.h"
#include "socket/wire.h"
#include "transport.h"

using namespace comm;
using namespace comm::transport;
using namespace comm::transport::sock;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t at = 0;
  // The acceptor's reads: the Hello, then the Proof it checks against the job secret.
  Nonce client_nonce{}, server_nonce{};
  if (size >= sizeof(Hello)) {
    Hello h;
    std::memcpy(&h, data, sizeof h);
    at = sizeof h;
    if (hello_problem(h).empty())
      FUZZ_CHECK(h.magic == kHelloMagic && h.version == kProtocolVersion && (h.flags & ~kHelloTls) == 0 && h.reserved == 0);
    std::memcpy(client_nonce.data(), h.nonce, client_nonce.size());
  }
  if (size - at >= sizeof(Proof)) {
    Proof p;
    std::memcpy(&p, data + at, sizeof p);
    at += sizeof p;
    // Accepted exactly when it is the proof made with the secret (constant-time compare included).
    const Digest real = proof_of_secret("fuzz-secret", proof_context("comm 0", 1, 0), Prover::kClient, client_nonce, server_nonce);
    FUZZ_CHECK(check_proof("fuzz-secret", proof_context("comm 0", 1, 0), Prover::kClient, client_nonce, server_nonce, p.proof) ==
               (std::memcmp(p.proof, real.data(), real.size()) == 0));
  }
  // The connector's read: a Reply, and what its code says follows it fits the buffer mesh.cc has.
  if (size - at >= sizeof(Reply)) {
    Reply r;
    std::memcpy(&r, data + at, sizeof r);
    at += sizeof r;
    FUZZ_CHECK(reply_extra_bytes(r.code) <= kDigestBytes);
  }
  while (size - at >= sizeof(FrameHeader)) {
    FrameHeader h;
    std::memcpy(&h, data + at, sizeof h);
    at += sizeof h;
    if (!frame_problem(h).empty()) break;  // the connection is closed here
    switch (static_cast<FrameKind>(h.kind)) {
      case FrameKind::kError:
        FUZZ_CHECK(h.length <= kMaxErrorText);
        break;
      case FrameKind::kHeartbeat:
      case FrameKind::kGoodbye:
        FUZZ_CHECK(h.length == 0);
        break;
      case FrameKind::kData: {
        FUZZ_CHECK(h.offset <= h.total_bytes && h.length <= h.total_bytes - h.offset);
        FUZZ_CHECK(h.coll >= static_cast<uint8_t>(CollKind::kAllreduce) &&
                   h.coll <= static_cast<uint8_t>(CollKind::kInternal));
        // The receiver's own striping of a message of that size: parts tile it in order.
        const int nconns = 1 + static_cast<int>(h.dtype % kMaxConns);
        const int parts = stripe_parts(h.total_bytes, nconns);
        uint64_t next = 0;
        for (int k = 0; k < parts; ++k) {
          uint64_t offset = 0, length = 0;
          stripe_part(h.total_bytes, parts, k, &offset, &length);
          FUZZ_CHECK(offset == next && length <= h.total_bytes - offset);
          next = offset + length;
        }
        FUZZ_CHECK(next == h.total_bytes);
        break;
      }
      default:
        FUZZ_CHECK(false);  // frame_problem accepted a kind it does not know
    }
  }
  return 0;
}

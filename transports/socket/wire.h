// What the socket transport puts on the wire: the connection handshake and the frame
// header in front of every message part. Fixed-size, naturally aligned structs in host
// byte order; a peer of another byte order or version fails the magic/version check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "crypto/proof.h"

namespace comm::transport::sock {

// ---- handshake (crypto/proof.h; the secret never goes on the wire):
//   connector -> acceptor: Hello, with a fresh client nonce
//   acceptor -> connector: Reply kChallenge, then kNonceBytes of server nonce
//   connector -> acceptor: Proof, the connector's proof of the job secret
//   acceptor -> connector: Reply kOk, then kDigestBytes of the acceptor's proof; or a refusal.
// A Hello of another version is answered by a bare Reply kBadVersion, as every version did.
constexpr uint64_t kHelloMagic = 0x4b53434d4d4f4331ull;  // "1COMMCSK"
constexpr uint64_t kReplyMagic = 0x4b43414d4d4f4331ull;  // "1COMMACK"
constexpr uint64_t kProofMagic = 0x4652504d4d4f4331ull;  // "1COMMPRF"
// 2: connections are made on first use, from either side (kYield).
// 3: HEARTBEAT and GOODBYE frames (idle detection).
// 4: the job secret proven by challenge-response (kChallenge, Proof), never sent.
// 5: the Hello names the rank it dials (target); both proofs bind the communicator, that rank
//    and its host (proof_context), so a dial knows whom it reached (kWrongRank).
constexpr uint32_t kProtocolVersion = 5;
// Binds the socket transport's proofs to this protocol, to the communicator (its label, the same
// on every rank), to the rank dialed and to that rank's host (its number in the host map): an
// address that every host has (a Docker bridge's) can land on a listener of the same job, and
// the dial must not take it for the rank it wanted (docs/topology.md, "Messy networks").
inline std::string proof_context(const std::string& comm_label, int target, int target_host) {
  return "libcomm socket v5|" + comm_label + "|rank " + std::to_string(target) + "|host " +
         std::to_string(target_host);
}

// magic and version where every version had them: a peer of another version is told so.
struct Hello {
  uint64_t magic;
  uint32_t version;
  int32_t rank;  // the connecting rank
  int32_t size;  // its world size
  uint32_t conn_index;
  uint32_t nconns;
  uint32_t flags;  // kHelloTls, or 0 (was `reserved`, always 0)
  uint8_t nonce[kNonceBytes];  // the connector's
  int32_t target;     // the rank it dials (version 5)
  uint32_t reserved;  // 0
};
static_assert(sizeof(Hello) == 56);
// The connector runs COMM_TLS=1: a TLS handshake follows the kOk. An acceptor that does not agree
// answers kTlsMismatch, so both name the difference instead of failing on garbage.
constexpr uint32_t kHelloTls = 1;
// The acceptor's first TLS record: it accepted the connector (with certificates, the connector's
// certificate), so a connector that reads it knows the connection is usable; one that reads an
// alert instead knows why not. A TLS 1.3 client ends its handshake before the server checks it.
constexpr uint64_t kTlsReady = 0x594452534c544331ull;  // "1CTLSRDY"

struct Proof {
  uint64_t magic;  // kProofMagic
  uint8_t proof[kDigestBytes];
};
static_assert(sizeof(Proof) == 40);

enum class ReplyCode : uint32_t {
  kOk = 0,
  kBadVersion = 1,
  kBadSecret = 2,
  kBadRank = 3,
  kSizeMismatch = 4,
  kNconnsMismatch = 5,
  kDuplicate = 6,
  kYield = 7,  // both ranks dialed this connection: the acceptor's (higher rank's) dial wins
  kChallenge = 8,  // followed by the server nonce; the connector answers with its Proof
  kTlsMismatch = 9,  // COMM_TLS differs; value: the acceptor's (0 or 1)
  kWrongRank = 10,   // the Hello's target is not this rank; value: the acceptor's rank
};

struct Reply {
  uint64_t magic;
  uint32_t code;   // ReplyCode
  uint32_t value;  // kSizeMismatch / kNconnsMismatch: the acceptor's value
};
static_assert(sizeof(Reply) == 16);
// Bytes that follow a Reply of this code: the server nonce (kChallenge), the acceptor's proof (kOk).
inline size_t reply_extra_bytes(uint32_t code) {
  if (code == static_cast<uint32_t>(ReplyCode::kChallenge)) return kNonceBytes;
  if (code == static_cast<uint32_t>(ReplyCode::kOk)) return kDigestBytes;
  return 0;
}

// ---- frames: header, then `length` payload bytes.
constexpr uint32_t kFrameMagic = 0x314d5246u;  // "FRM1"
// HEARTBEAT: "still alive", sent on connection 0 of an idle peer every COMM_HEARTBEAT_MS;
// GOODBYE: sent on every connection by comm_destroy, so the close that follows is not a death.
// Both are a bare header (length 0) between frames.
enum class FrameKind : uint8_t { kData = 1, kError = 2, kHeartbeat = 3, kGoodbye = 4 };
constexpr uint32_t kMaxErrorText = 1024;  // an ERROR frame's payload: the sender's message

struct FrameHeader {
  uint32_t magic;
  uint8_t kind;  // FrameKind
  uint8_t coll;  // OpTag fields
  uint8_t dtype;
  uint8_t op;
  int32_t root;
  uint32_t status;  // ERROR: the sender's comm_status_t
  uint64_t seq;
  uint64_t count;
  uint64_t total_bytes;  // DATA: the whole message; ERROR: the text length
  uint64_t offset;       // this part's place in the message
  uint64_t length;       // this part's payload bytes
};
static_assert(sizeof(FrameHeader) == 56);

// What the receiver checks before a header from the wire indexes or sizes anything (wire.cc).
// "" when it is usable; else why not, for the log line that goes with closing the connection.
// Accepted: a known kind; ERROR: text of at most kMaxErrorText bytes; HEARTBEAT and GOODBYE:
// no payload; DATA: a known collective, and [offset, offset + length) inside total_bytes.
std::string frame_problem(const FrameHeader& h);
// The acceptor's checks of a whole Hello before it sends its challenge: magic, version, flags,
// reserved (the target is the acceptor's to check: kWrongRank).
std::string hello_problem(const Hello& h);

// ---- striping: a function of the message size (and the connection count every rank agreed
// on at the handshake) only, so both sides know which connection carries which bytes and
// each connection stays FIFO.
constexpr int kMaxConns = 8;
constexpr uint64_t kStripeThreshold = 256 * 1024;

inline int stripe_parts(uint64_t bytes, int nconns) { return bytes > kStripeThreshold ? nconns : 1; }

// Part k of n goes on connection k. For bytes > kStripeThreshold and n <= kMaxConns every part
// is non-empty ((n-1) * ceil(bytes/n) < bytes whenever (n-1)^2 < bytes).
// (ceil without bytes + n - 1, which wraps for sizes near 2^64: fuzz/corpus/socket_wire/stripe-near-2to64.)
inline void stripe_part(uint64_t bytes, int nparts, int k, uint64_t* offset, uint64_t* length) {
  const uint64_t n = static_cast<uint64_t>(nparts);
  uint64_t chunk = bytes / n + (bytes % n != 0 ? 1 : 0);
  uint64_t begin = chunk * static_cast<uint64_t>(k);  // < 2^64 for k < nparts <= kMaxConns
  *offset = begin < bytes ? begin : bytes;
  *length = chunk < bytes - *offset ? chunk : bytes - *offset;  // not begin + chunk: it may wrap
}

}  // namespace comm::transport::sock

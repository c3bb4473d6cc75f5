// Proving a shared secret (COMM_AUTH_TOKEN for the TCP store, the job secret for the socket
// transport's connections) without sending it: challenge-response over HMAC-SHA256. The store
// (store/tcp_store.cc, store/tcp_store_server.cc) and the socket transport (socket/mesh.cc)
// both run the same four steps:
//
//   client -> server: hello, with a fresh client nonce
//   server -> client: a fresh server nonce
//   client -> server: proof_of_secret(kClient)   the server checks it (check_proof), else refuses
//   server -> client: proof_of_secret(kServer)   the client checks it, else gives up
//
// Fresh nonces on both sides make every proof good for one connection only: a recorded
// handshake replays nowhere. The client proves first, so the server computes nothing with the
// secret for a stranger; the roles and the context are hashed in, so a proof is good for
// neither the other direction nor the other protocol. Nothing is encrypted: what follows the
// handshake travels in clear (docs/design/base.md, "Rendezvous").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "crypto/sha256.h"
#include "status.h"

namespace comm {

inline constexpr size_t kNonceBytes = 16;
using Nonce = std::array<uint8_t, kNonceBytes>;

// Fresh random bytes from getrandom(2).
Status random_nonce(Nonce* out);

enum class Prover : uint8_t { kClient, kServer };

// HMAC-SHA256(secret, context | 0 | "client" or "server" | 0 | the other side's nonce | the
// prover's own nonce). context names the protocol ("store", "socket").
Digest proof_of_secret(std::string_view secret, std::string_view context, Prover who, const Nonce& client_nonce,
                       const Nonce& server_nonce);

// Whether `presented` (kDigestBytes bytes) is that proof; compares in constant time.
inline constexpr size_t kDigestBytes = 32;
bool check_proof(std::string_view secret, std::string_view context, Prover who, const Nonce& client_nonce,
                 const Nonce& server_nonce, const uint8_t* presented);

}  // namespace comm

// The challenge-response proof of a shared secret: see proof.h.
#include "crypto/proof.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace comm {

Status random_nonce(Nonce* out) {
  size_t got = 0;
  while (got < out->size()) {
    ssize_t n = getrandom(out->data() + got, out->size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return SystemError("getrandom failed: " + errno_string(errno));
    }
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Digest proof_of_secret(std::string_view secret, std::string_view context, Prover who, const Nonce& client_nonce,
                       const Nonce& server_nonce) {
  const bool client = who == Prover::kClient;
  std::string msg(context);
  msg.push_back('\0');
  msg += client ? "client" : "server";
  msg.push_back('\0');
  const Nonce& theirs = client ? server_nonce : client_nonce;
  const Nonce& mine = client ? client_nonce : server_nonce;
  msg.append(reinterpret_cast<const char*>(theirs.data()), theirs.size());
  msg.append(reinterpret_cast<const char*>(mine.data()), mine.size());
  return hmac_sha256(secret.data(), secret.size(), msg.data(), msg.size());
}

bool check_proof(std::string_view secret, std::string_view context, Prover who, const Nonce& client_nonce,
                 const Nonce& server_nonce, const uint8_t* presented) {
  Digest given;
  std::memcpy(given.data(), presented, given.size());
  return digest_equal(given, proof_of_secret(secret, context, who, client_nonce, server_nonce));
}

}  // namespace comm

// SHA-256 and HMAC-SHA256 from OpenSSL's libcrypto: see sha256.h.
#include "crypto/sha256.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace comm {

// libcrypto fails these only without memory or with SHA-256 disabled by its configuration; the
// digest then stays zero, which matches no honest peer's proof or digest key: the handshake or
// the verdict's digest check fails, never passes.
Digest sha256(const void* data, size_t n) {
  Digest d{};
  unsigned int len = 0;
  (void)EVP_Digest(data, n, d.data(), &len, EVP_sha256(), nullptr);
  return d;
}

Digest hmac_sha256(const void* key, size_t key_len, const void* msg, size_t msg_len) {
  static const unsigned char kNoKey = 0;  // a null key would mean "the previous key" to HMAC_Init
  Digest d{};
  unsigned int len = 0;
  (void)HMAC(EVP_sha256(), key_len == 0 ? &kNoKey : key, static_cast<int>(key_len),
             static_cast<const unsigned char*>(msg), msg_len, d.data(), &len);
  return d;
}

std::string hex(const Digest& d) {
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(64);
  for (uint8_t b : d) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

bool digest_equal(const Digest& a, const Digest& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

}  // namespace comm

#include "tls/gcm.h"

#include <openssl/evp.h>

#include <cctype>

#include "params.h"
#include "tls/gcm_engines.h"

namespace comm::tls::gcm {
namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct Choice {
  Engine engine = Engine::kOpenSsl;
  std::string why;
};

Choice choose() {
  Choice c;
  std::string cipher, aes;
  const Status st = params::get_string("COMM_TLS_CIPHER", &cipher);
  const Status old = params::get_string("COMM_TLS_AES", &aes);
  if (!st.ok() || !old.ok()) {
    c.why = (!st.ok() ? st : old).message() + "; OpenSSL's EVP";
    return c;
  }
  cipher = lower(cipher);
  // The older knob forces OpenSSL where the newer one is left at auto.
  if (cipher == "auto" && lower(aes) == "openssl") cipher = "openssl";
  if (cipher == "openssl") {
    c.why = "OpenSSL's EVP (COMM_TLS_CIPHER=openssl)";
    return c;
  }
  // FIPS mode: only the validated module's AES-GCM.
  if (EVP_default_properties_is_fips_enabled(nullptr) == 1) {
    c.why = "OpenSSL's EVP (OpenSSL runs in FIPS mode)";
    return c;
  }
  std::string detail;
  bool vaes = false;
  const bool usable = ipsec_mb_usable(&detail, &vaes);
  if (cipher == "ipsec-mb") {
    if (usable) {
      c.engine = Engine::kIpsecMb;
      c.why = "ipsec-mb's " + detail + " (COMM_TLS_CIPHER=ipsec-mb)";
    } else {
      c.why = "OpenSSL's EVP: COMM_TLS_CIPHER=ipsec-mb, but " + detail;
    }
    return c;
  }
  if (usable && vaes) {
    c.engine = Engine::kIpsecMb;
    c.why = "ipsec-mb's " + detail;
  } else {
    c.why = "OpenSSL's EVP (ipsec-mb: " + (usable ? detail + ", not a VAES path" : detail) + ")";
  }
  return c;
}

}  // namespace

const char* engine_name(Engine e) { return e == Engine::kIpsecMb ? "ipsec-mb" : "openssl"; }

Engine chosen_engine(std::string* why) {
  static const Choice choice = choose();
  if (why != nullptr) *why = choice.why;
  return choice.engine;
}

void counter_block(const uint8_t nonce[12], uint64_t index, uint8_t out[16]) {
  for (int i = 0; i < 12; ++i) out[i] = nonce[i];
  const auto ctr = static_cast<uint32_t>(index + 2);  // inc32 wraps modulo 2^32
  out[12] = static_cast<uint8_t>(ctr >> 24);
  out[13] = static_cast<uint8_t>(ctr >> 16);
  out[14] = static_cast<uint8_t>(ctr >> 8);
  out[15] = static_cast<uint8_t>(ctr);
}

std::unique_ptr<Cipher> Cipher::create(Engine e) {
  return e == Engine::kIpsecMb ? make_ipsec_mb_cipher() : make_openssl_cipher();
}

}  // namespace comm::tls::gcm

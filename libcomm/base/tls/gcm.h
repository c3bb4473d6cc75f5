// AES-128-GCM for libcomm's TLS records (tls/records.h), from maintained code only: Intel's
// ipsec-mb (opened at run time, tls/gcm_ipsec_mb.cc) where it has a VAES path for this CPU, else
// OpenSSL's EVP (tls/gcm_openssl.cc). libcomm owns no AES or GHASH of its own: what is ours is the
// glue, the constant-time tag comparison and the wiping of keys and contexts.
//
// Which code runs is decided once per process (chosen_engine), by COMM_TLS_CIPHER (auto, ipsec-mb,
// openssl; COMM_TLS_AES=openssl, the older name, still forces OpenSSL): auto takes ipsec-mb where
// its GCM functions for this CPU are the VAES ones (about twice OpenSSL 3.0's speed on one core,
// docs/benchmarks.md "TLS against plaintext"), and OpenSSL wherever OpenSSL runs in FIPS
// mode. Both give the same bytes (tests/base/test_gcm.cc), so two hosts that chose differently
// read each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace comm::tls::gcm {

enum class Engine { kOpenSsl, kIpsecMb };
const char* engine_name(Engine e);

// The engine this process uses, and a line that says why (logged once at INFO by records.cc).
Engine chosen_engine(std::string* why = nullptr);

// Whether ipsec-mb can run here, and the name of the GCM function it would call: *detail is
// "aes_gcm_enc_128_update_vaes_avx512 (ipsec-mb 1.3.0)" or why it cannot.
bool ipsec_mb_usable(std::string* detail, bool* vaes);

// One direction's key. A message is begin(), then encrypt() or decrypt() over its text in pieces
// of any size (a piece may end inside a block), then seal_tag() or open_tag(). The key and every
// message's state are wiped when replaced and on destruction.
class Cipher {
 public:
  // nullptr where the engine cannot run here (ipsec-mb absent, or OpenSSL failed).
  static std::unique_ptr<Cipher> create(Engine e);
  virtual ~Cipher() = default;
  virtual Engine engine() const = 0;
  virtual bool set_key(const uint8_t key[16]) = 0;
  virtual bool begin(const uint8_t nonce[12], const uint8_t* aad, size_t aad_len) = 0;
  virtual bool encrypt(const uint8_t* in, uint8_t* out, size_t n) = 0;
  virtual bool decrypt(const uint8_t* in, uint8_t* out, size_t n) = 0;
  // The tag of the text encrypted since begin().
  virtual bool seal_tag(uint8_t tag[16]) = 0;
  // Whether `tag` is the tag of the text decrypted since begin(), compared in constant time.
  virtual bool open_tag(const uint8_t tag[16]) = 0;
  // The byte at `offset` of a message's text under `nonce`, decrypted alone from its ciphertext
  // byte `in` (GCM's counter mode: E(K, nonce | offset / 16 + 2)). Unauthenticated: it may only
  // choose where a record is opened (records.cc: padding), never be trusted. Independent of the
  // message begin() started.
  virtual bool peek_byte(const uint8_t nonce[12], uint64_t offset, uint8_t in, uint8_t* out) = 0;
};

// The counter block of the text's block `index` under `nonce` (SP 800-38D: J0 = nonce | 1, the
// text starts at inc32(J0)).
void counter_block(const uint8_t nonce[12], uint64_t index, uint8_t out[16]);

}  // namespace comm::tls::gcm

// AES-128-GCM (NIST SP 800-38D) for libcomm's TLS records (tls/records.cc), with VAES and
// VPCLMULQDQ on 256-bit registers: two AES blocks per instruction and two GHASH products per
// carry-less multiply. OpenSSL 3.0 has no such code path for CPUs without AVX-512 (its stitched
// AES-NI GCM works on one 128-bit block per instruction), and on a 2-core host sealing and opening
// the records was a third of all CPU time in a TLS all-reduce (issue 28).
//
// Used only where cpu_has_vaes() says the CPU and the OS can run it and COMM_TLS_AES is not
// "openssl" (records.cc); the code is compiled for those instructions function by function, so
// the rest of the build keeps its baseline target.
#pragma once

#include <cstddef>
#include <cstdint>

namespace comm::tls::gcm {

// AES-NI, PCLMULQDQ, SSSE3, AVX2, VAES and VPCLMULQDQ, and an OS that saves the ymm registers.
bool cpu_has_vaes();

// Blocks per GHASH reduction in the main loop (aes_gcm_vaes.cc). 16 measured no faster than 8
// on the 2-vCPU AMD EPYC of issue 28 (docs/benchmarks.md), and 8 keeps the key and the tail short.
constexpr int kBlocks = 8;

// One key: the AES-128 schedule and the hash key's powers. Secret: its owner wipes it.
struct Key {
  alignas(32) uint8_t round[11][16];
  // H^kBlocks, ..., H^2, H^1, each byte-reflected and pre-multiplied (aes_gcm_vaes.cc says why),
  // in the order the main loop pairs them with its blocks.
  alignas(32) uint8_t hpow[kBlocks][16];
};
void expand_key(Key* k, const uint8_t key[16]);

// One message (SP 800-38D section 7.1/7.2): a 96-bit nonce, the additional data, then the text in
// pieces of any size (a piece may end inside a block), then the tag. For decryption the caller
// compares tag() with the received one (in constant time) before it trusts the plaintext.
class Stream {
 public:
  Stream(const Key& k, const uint8_t nonce[12], const uint8_t* aad, size_t aad_len);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  // in may equal out.
  void encrypt(const uint8_t* in, uint8_t* out, size_t n) { crypt(in, out, n, true); }
  void decrypt(const uint8_t* in, uint8_t* out, size_t n) { crypt(in, out, n, false); }
  void tag(uint8_t out[16]);  // the tag of the text so far; the stream may go on after it

 private:
  void crypt(const uint8_t* in, uint8_t* out, size_t n, bool encrypt);

  const Key& key_;
  alignas(16) uint8_t ctr_[16];   // the next counter block, byte-reversed (its counter in the low dword)
  alignas(16) uint8_t x_[16];     // GHASH so far, byte-reversed
  alignas(16) uint8_t mask_[16];  // E(K, J0), what the tag is XORed with
  alignas(16) uint8_t ks_[16];    // the key stream of a block the last piece ended inside
  alignas(16) uint8_t part_[16];  // that block's ciphertext so far
  size_t pos_ = 0;                // its bytes done (0: none pending)
  uint64_t aad_len_ = 0, text_len_ = 0;
};

}  // namespace comm::tls::gcm

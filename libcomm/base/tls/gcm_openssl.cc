// AES-128-GCM by OpenSSL's EVP (tls/gcm.h): everywhere ipsec-mb has no VAES path, wherever OpenSSL
// runs in FIPS mode, and with COMM_TLS_CIPHER=openssl.
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <cstring>

#include "tls/gcm.h"
#include "tls/gcm_engines.h"

namespace comm::tls::gcm {
namespace {

class OpenSslCipher final : public Cipher {
 public:
  OpenSslCipher() : ctx_(EVP_CIPHER_CTX_new()), block_(EVP_CIPHER_CTX_new()) {}
  ~OpenSslCipher() override {  // each frees and wipes its key schedule
    EVP_CIPHER_CTX_free(ctx_);
    EVP_CIPHER_CTX_free(block_);
  }
  OpenSslCipher(const OpenSslCipher&) = delete;
  OpenSslCipher& operator=(const OpenSslCipher&) = delete;

  bool ready() const { return ctx_ != nullptr && block_ != nullptr; }
  Engine engine() const override { return Engine::kOpenSsl; }

  bool set_key(const uint8_t key[16]) override {
    return EVP_CipherInit_ex(ctx_, EVP_aes_128_gcm(), nullptr, key, nullptr, 1) == 1 &&
           EVP_EncryptInit_ex(block_, EVP_aes_128_ecb(), nullptr, key, nullptr) == 1 &&
           EVP_CIPHER_CTX_set_padding(block_, 0) == 1;
  }
  bool peek_byte(const uint8_t nonce[12], uint64_t offset, uint8_t in, uint8_t* out) override {
    uint8_t counter[16], stream[16];
    counter_block(nonce, offset / 16, counter);
    int outl = 0;
    const bool ok = EVP_EncryptUpdate(block_, stream, &outl, counter, 16) == 1 && outl == 16;
    *out = static_cast<uint8_t>(in ^ stream[offset % 16]);
    OPENSSL_cleanse(stream, sizeof stream);
    return ok;
  }
  bool begin(const uint8_t nonce[12], const uint8_t* aad, size_t aad_len) override {
    // The direction is fixed by the first encrypt() or decrypt() of the message: EVP asks for it
    // with the nonce, so the nonce and the additional data wait until then.
    if (aad_len > sizeof aad_) return false;
    std::memcpy(nonce_, nonce, sizeof nonce_);
    if (aad_len > 0) std::memcpy(aad_, aad, aad_len);
    aad_len_ = aad_len;
    started_ = false;
    return true;
  }
  bool encrypt(const uint8_t* in, uint8_t* out, size_t n) override { return update(1, in, out, n); }
  bool decrypt(const uint8_t* in, uint8_t* out, size_t n) override { return update(0, in, out, n); }
  bool seal_tag(uint8_t tag[16]) override {
    int outl = 0;
    uint8_t none[16];
    return (started_ || start(1)) && EVP_EncryptFinal_ex(ctx_, none, &outl) == 1 &&
           EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_AEAD_GET_TAG, 16, tag) == 1;
  }
  bool open_tag(const uint8_t tag[16]) override {
    // OpenSSL compares the tags itself (in constant time, CRYPTO_memcmp): its GCM hands out no
    // computed tag when decrypting.
    int outl = 0;
    uint8_t none[16];
    return (started_ || start(0)) &&
           EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_AEAD_SET_TAG, 16, const_cast<uint8_t*>(tag)) == 1 &&
           EVP_DecryptFinal_ex(ctx_, none, &outl) == 1;
  }

 private:
  bool start(int enc) {
    int outl = 0;
    started_ = EVP_CipherInit_ex(ctx_, nullptr, nullptr, nullptr, nonce_, enc) == 1 &&
               (aad_len_ == 0 || EVP_CipherUpdate(ctx_, nullptr, &outl, aad_, static_cast<int>(aad_len_)) == 1);
    return started_;
  }
  bool update(int enc, const uint8_t* in, uint8_t* out, size_t n) {
    if (!started_ && !start(enc)) return false;
    int outl = 0;
    return n == 0 || EVP_CipherUpdate(ctx_, out, &outl, in, static_cast<int>(n)) == 1;
  }

  EVP_CIPHER_CTX* ctx_;
  EVP_CIPHER_CTX* block_;  // AES-128 alone, the same key: peek_byte's one block
  uint8_t nonce_[12] = {};
  uint8_t aad_[64] = {};  // a record's header is 5 bytes
  size_t aad_len_ = 0;
  bool started_ = false;
};

}  // namespace

std::unique_ptr<Cipher> make_openssl_cipher() {
  auto c = std::make_unique<OpenSslCipher>();
  if (!c->ready()) return nullptr;
  return c;
}

}  // namespace comm::tls::gcm

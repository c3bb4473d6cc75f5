// AES-128-GCM by Intel's ipsec-mb (tls/gcm.h), opened with dlopen like UCX, so that libcomm.so.1
// loads on hosts without it. The manager is made once per process by init_mb_mgr_auto, which picks
// the code for this CPU; its GCM functions carry no state of their own (the key and the message's
// context are ours), so every connection of every thread shares it. Used only where those
// functions are the VAES ones (dladdr names them): elsewhere OpenSSL's EVP is as fast or faster.
#include <dlfcn.h>
#include <openssl/crypto.h>

#include <cstring>
#include <mutex>

#include "tls/gcm.h"
#include "tls/gcm_engines.h"

#if __has_include(<intel-ipsec-mb.h>)
#include <intel-ipsec-mb.h>
#define COMM_HAVE_IPSEC_MB 1
#endif

namespace comm::tls::gcm {

#ifdef COMM_HAVE_IPSEC_MB
namespace {

struct Library {
  IMB_MGR* mgr = nullptr;
  std::string detail;  // the GCM function chosen and the version, or why none
  bool vaes = false;
};

const Library& library() {
  static Library lib;
  static std::once_flag once;
  std::call_once(once, [] {
    // Version 1 of the ABI is what these headers describe (IMB_MGR's layout).
    void* h = dlopen("libIPSec_MB.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      lib.detail = std::string("libIPSec_MB.so.1 not found (Debian: libipsec-mb1): ") + dlerror();
      return;
    }
    auto alloc = reinterpret_cast<decltype(&alloc_mb_mgr)>(dlsym(h, "alloc_mb_mgr"));
    auto init = reinterpret_cast<decltype(&init_mb_mgr_auto)>(dlsym(h, "init_mb_mgr_auto"));
    auto version = reinterpret_cast<decltype(&imb_get_version_str)>(dlsym(h, "imb_get_version_str"));
    auto version_num = reinterpret_cast<decltype(&imb_get_version)>(dlsym(h, "imb_get_version"));
    if (alloc == nullptr || init == nullptr || version == nullptr || version_num == nullptr) {
      lib.detail = "libIPSec_MB.so.1 lacks alloc_mb_mgr, init_mb_mgr_auto or imb_get_version";
      return;
    }
    const std::string ver = version();
    // IMB_MGR's layout changed inside ABI 1 before 1.3 (the header's IMB_VERSION_NUM).
    if (version_num() < IMB_VERSION(1, 3, 0)) {
      lib.detail = "ipsec-mb " + ver + " is older than 1.3 (whose manager layout this build knows)";
      return;
    }
    IMB_MGR* mgr = alloc(0);
    if (mgr == nullptr) {
      lib.detail = "ipsec-mb " + ver + ": alloc_mb_mgr failed";
      return;
    }
    IMB_ARCH arch = IMB_ARCH_NONE;
    init(mgr, &arch);
    if ((mgr->features & IMB_FEATURE_SELF_TEST) != 0 && (mgr->features & IMB_FEATURE_SELF_TEST_PASS) == 0) {
      lib.detail = "ipsec-mb " + ver + ": its self-test failed";
      return;  // the manager is never used (nor freed: once per process)
    }
    if (mgr->gcm128_pre == nullptr || mgr->gcm128_init == nullptr || mgr->gcm128_enc_update == nullptr ||
        mgr->gcm128_dec_update == nullptr || mgr->gcm128_enc_finalize == nullptr ||
        mgr->gcm128_dec_finalize == nullptr || mgr->aes128_cfb_one == nullptr) {
      lib.detail = "ipsec-mb " + ver + " has no AES-128-GCM for this CPU";
      return;
    }
    Dl_info info{};
    const char* name = dladdr(reinterpret_cast<void*>(mgr->gcm128_enc_update), &info) != 0 && info.dli_sname != nullptr
                           ? info.dli_sname
                           : "an unnamed function";
    lib.vaes = std::strstr(name, "vaes") != nullptr;
    lib.detail = std::string(name) + " (ipsec-mb " + ver + ")";
    lib.mgr = mgr;
  });
  return lib;
}

class IpsecMbCipher final : public Cipher {
 public:
  explicit IpsecMbCipher(IMB_MGR* mgr) : mgr_(mgr) {}
  ~IpsecMbCipher() override {
    OPENSSL_cleanse(&key_, sizeof key_);
    OPENSSL_cleanse(&ctx_, sizeof ctx_);
  }
  IpsecMbCipher(const IpsecMbCipher&) = delete;
  IpsecMbCipher& operator=(const IpsecMbCipher&) = delete;

  Engine engine() const override { return Engine::kIpsecMb; }
  bool set_key(const uint8_t key[16]) override {
    OPENSSL_cleanse(&key_, sizeof key_);
    mgr_->gcm128_pre(key, &key_);  // the round keys and the hash key's powers
    return true;
  }
  bool begin(const uint8_t nonce[12], const uint8_t* aad, size_t aad_len) override {
    mgr_->gcm128_init(&key_, &ctx_, nonce, aad, aad_len);
    return true;
  }
  bool encrypt(const uint8_t* in, uint8_t* out, size_t n) override {
    if (n > 0) mgr_->gcm128_enc_update(&key_, &ctx_, out, in, n);
    return true;
  }
  bool decrypt(const uint8_t* in, uint8_t* out, size_t n) override {
    if (n > 0) mgr_->gcm128_dec_update(&key_, &ctx_, out, in, n);
    return true;
  }
  bool seal_tag(uint8_t tag[16]) override {
    mgr_->gcm128_enc_finalize(&key_, &ctx_, tag, 16);
    OPENSSL_cleanse(&ctx_, sizeof ctx_);
    return true;
  }
  bool peek_byte(const uint8_t nonce[12], uint64_t offset, uint8_t in, uint8_t* out) override {
    // One block of CFB is in XOR E(K, iv): with the counter block as its iv, counter mode's byte.
    // The GCM key's first round keys are AES-128's schedule (gcm128_pre expands it there).
    alignas(16) uint8_t counter[16], block[16] = {}, plain[16];
    counter_block(nonce, offset / 16, counter);
    block[offset % 16] = in;
    mgr_->aes128_cfb_one(plain, block, counter, key_.expanded_keys, 16);
    *out = plain[offset % 16];
    OPENSSL_cleanse(plain, sizeof plain);
    return true;
  }
  bool open_tag(const uint8_t tag[16]) override {
    uint8_t computed[16];
    mgr_->gcm128_dec_finalize(&key_, &ctx_, computed, sizeof computed);
    const bool same = CRYPTO_memcmp(computed, tag, sizeof computed) == 0;  // constant time
    OPENSSL_cleanse(computed, sizeof computed);
    OPENSSL_cleanse(&ctx_, sizeof ctx_);
    return same;
  }

 private:
  IMB_MGR* mgr_;
  // 64-byte aligned: the header asks for it only where LINUX is defined (its own build).
  alignas(64) struct gcm_key_data key_;
  struct gcm_context_data ctx_ {};
};

}  // namespace

bool ipsec_mb_usable(std::string* detail, bool* vaes) {
  const Library& lib = library();
  if (detail != nullptr) *detail = lib.detail;
  if (vaes != nullptr) *vaes = lib.vaes;
  return lib.mgr != nullptr;
}

std::unique_ptr<Cipher> make_ipsec_mb_cipher() {
  const Library& lib = library();
  if (lib.mgr == nullptr) return nullptr;
  return std::make_unique<IpsecMbCipher>(lib.mgr);
}

#else  // built without intel-ipsec-mb.h (Debian: libipsec-mb-dev)

bool ipsec_mb_usable(std::string* detail, bool* vaes) {
  if (detail != nullptr) *detail = "built without ipsec-mb's header (Debian: libipsec-mb-dev)";
  if (vaes != nullptr) *vaes = false;
  return false;
}

std::unique_ptr<Cipher> make_ipsec_mb_cipher() { return nullptr; }

#endif

}  // namespace comm::tls::gcm

// The AES-128-GCM engines of libcomm's TLS records (libcomm/base/tls/gcm.h) against OpenSSL's EVP
// used directly, byte for byte: random keys, nonces, additional data and texts of every length
// around the blocks and the 16 KiB record, split into pieces at random points as a record's iovecs
// split them (single bytes too); the published AES-128 test cases of the GCM specification
// (McGrew and Viega, test cases 2-4); a flipped bit anywhere refused; peek_byte against the text.
// The OpenSSL engine's cases run everywhere ([gcm]); ipsec-mb's are tagged [ipsec-mb] and run in
// their own meson test, which says SKIP (77) where ipsec-mb does not load (tests/base/meson.build).
#include <openssl/evp.h>
#include <time.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tls/gcm.h"

namespace gcm = comm::tls::gcm;

namespace {

using Bytes = std::vector<uint8_t>;
using Cut = std::vector<std::pair<size_t, size_t>>;

Bytes hex(const std::string& s) {
  Bytes b;
  for (size_t i = 0; i + 1 < s.size(); i += 2)
    b.push_back(static_cast<uint8_t>(std::stoi(s.substr(i, 2), nullptr, 16)));
  return b;
}

struct Sealed {
  Bytes text, tag;
};

Sealed openssl_seal(const Bytes& key, const Bytes& nonce, const Bytes& aad, const Bytes& plain) {
  Sealed s;
  s.text.resize(plain.size());
  s.tag.resize(16);
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  REQUIRE(ctx != nullptr);
  int outl = 0;
  REQUIRE(EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), nullptr, key.data(), nonce.data()) == 1);
  if (!aad.empty()) REQUIRE(EVP_EncryptUpdate(ctx, nullptr, &outl, aad.data(), static_cast<int>(aad.size())) == 1);
  if (!plain.empty())
    REQUIRE(EVP_EncryptUpdate(ctx, s.text.data(), &outl, plain.data(), static_cast<int>(plain.size())) == 1);
  uint8_t none[16];
  REQUIRE(EVP_EncryptFinal_ex(ctx, none, &outl) == 1);
  REQUIRE(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, s.tag.data()) == 1);
  EVP_CIPHER_CTX_free(ctx);
  return s;
}

// The text cut into 1-3 pieces at random points, as seal() walks its iovecs.
Cut pieces(size_t size, std::mt19937_64& rng) {
  std::vector<size_t> cuts = {0, size};
  const int extra = static_cast<int>(rng() % 3);
  for (int i = 0; i < extra; ++i) cuts.push_back(size == 0 ? 0 : rng() % (size + 1));
  std::sort(cuts.begin(), cuts.end());
  Cut out;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) out.emplace_back(cuts[i], cuts[i + 1] - cuts[i]);
  return out;
}

Bytes random_bytes(size_t n, std::mt19937_64& rng) {
  Bytes b(n);
  for (auto& c : b) c = static_cast<uint8_t>(rng());
  return b;
}

std::unique_ptr<gcm::Cipher> cipher(gcm::Engine e, const Bytes& key) {
  auto c = gcm::Cipher::create(e);
  REQUIRE(c != nullptr);
  REQUIRE(c->engine() == e);
  REQUIRE(c->set_key(key.data()));
  return c;
}

Sealed seal(gcm::Cipher& c, const Bytes& nonce, const Bytes& aad, const Bytes& plain, const Cut& cut,
            bool in_place) {
  Sealed s;
  s.text = in_place ? plain : Bytes(plain.size());
  s.tag.resize(16);
  REQUIRE(c.begin(nonce.data(), aad.data(), aad.size()));
  for (const auto& [at, n] : cut)
    REQUIRE(c.encrypt((in_place ? s.text.data() : plain.data()) + at, s.text.data() + at, n));
  REQUIRE(c.seal_tag(s.tag.data()));
  return s;
}

// Opens as records.cc does: decrypt, then the tag (compared in constant time by the engine).
bool open(gcm::Cipher& c, const Bytes& nonce, const Bytes& aad, const Bytes& text, const Bytes& tag, const Cut& cut,
          Bytes* plain) {
  plain->assign(text.size(), 0);
  if (!c.begin(nonce.data(), aad.data(), aad.size())) return false;
  for (const auto& [at, n] : cut)
    if (!c.decrypt(text.data() + at, plain->data() + at, n)) return false;
  return c.open_tag(tag.data());
}

void specification_cases(gcm::Engine e) {
  struct Case {
    const char *key, *iv, *plain, *aad, *cipher, *tag;
  };
  const std::string p3 =
      "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de"
      "657ba637b391aafd255";
  const std::string c3 =
      "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e21d514b25466931c7d8f6a5aac84aa051ba30b396a0aa"
      "c973d58e091473f5985";
  const Case cases[] = {
      {"00000000000000000000000000000000", "000000000000000000000000", "00000000000000000000000000000000", "",
       "0388dace60b6a392f328c2b971b2fe78", "ab6e47d42cec13bdf53a67b21257bddf"},
      {"feffe9928665731c6d6a8f9467308308", "cafebabefacedbaddecaf888", p3.c_str(), "", c3.c_str(),
       "4d5c2af327cd64a62cf35abd2ba6fab4"},
      {"feffe9928665731c6d6a8f9467308308", "cafebabefacedbaddecaf888", "", "feedfacedeadbeeffeedfacedeadbeefabaddad2",
       "", "5bc94fbc3221a5db94fae95ae7121a47"},
  };
  // Test case 4 is test case 3's text less its last 4 bytes, with additional data.
  const std::string p4 = p3.substr(0, 120), c4 = c3.substr(0, 120);
  for (int i = 0; i < 3; ++i) {
    const Case& c = cases[i];
    const Bytes key = hex(c.key), iv = hex(c.iv), aad = hex(c.aad);
    const Bytes plain = hex(i == 2 ? p4 : c.plain), text = hex(i == 2 ? c4 : c.cipher), tag = hex(c.tag);
    auto k = cipher(e, key);
    const Sealed s = seal(*k, iv, aad, plain, {{0, plain.size()}}, false);
    INFO(gcm::engine_name(e) << ", test case " << i + 2);
    CHECK(s.text == text);
    CHECK(s.tag == tag);
    Bytes opened;
    CHECK(open(*k, iv, aad, text, tag, {{0, text.size()}}, &opened));
    CHECK(opened == plain);
  }
}

void random_cases(gcm::Engine e) {
  const uint64_t seed = std::random_device{}();
  INFO(gcm::engine_name(e) << ", seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<size_t> sizes = {0,   1,   15,  16,   17,   31,    32,    33,    127,  128,
                               129, 255, 256, 257,  1000, 4095,  16383, 16384, 16385};
  for (int i = 0; i < 150; ++i) sizes.push_back(rng() % 16386);
  int checked = 0;
  for (const size_t size : sizes) {
    for (const size_t aad_len : {size_t{0}, size_t{5}, size_t{13}}) {
      const Bytes key = random_bytes(16, rng), nonce = random_bytes(12, rng);
      const Bytes aad = random_bytes(aad_len, rng), plain = random_bytes(size, rng);
      auto k = cipher(e, key);
      const Cut cut = pieces(size, rng);
      const bool in_place = rng() % 4 == 0;
      INFO("size " << size << ", aad " << aad_len << ", pieces " << cut.size() << (in_place ? ", in place" : ""));
      const Sealed want = openssl_seal(key, nonce, aad, plain);
      const Sealed got = seal(*k, nonce, aad, plain, cut, in_place);
      REQUIRE(got.text == want.text);
      REQUIRE(got.tag == want.tag);
      Bytes opened;
      REQUIRE(open(*k, nonce, aad, want.text, want.tag, pieces(size, rng), &opened));
      REQUIRE(opened == plain);
      // Any byte alone, as records.cc peeks at a record's last one.
      if (size > 0) {
        const size_t at = rng() % size;
        uint8_t peeked = 0;
        REQUIRE(k->peek_byte(nonce.data(), at, want.text[at], &peeked));
        REQUIRE(peeked == plain[at]);
      }
      // One bit flipped in the ciphertext, the tag or the additional data: refused.
      if (size > 0) {
        Bytes bad = want.text;
        bad[rng() % size] ^= static_cast<uint8_t>(1u << (rng() % 8));
        CHECK_FALSE(open(*k, nonce, aad, bad, want.tag, pieces(size, rng), &opened));
      }
      Bytes bad_tag = want.tag;
      bad_tag[rng() % 16] ^= static_cast<uint8_t>(1u << (rng() % 8));
      CHECK_FALSE(open(*k, nonce, aad, want.text, bad_tag, cut, &opened));
      if (aad_len > 0) {
        Bytes bad_aad = aad;
        bad_aad[rng() % aad_len] ^= static_cast<uint8_t>(1u << (rng() % 8));
        CHECK_FALSE(open(*k, nonce, bad_aad, want.text, want.tag, cut, &opened));
      }
      ++checked;
    }
  }
  CHECK(checked == static_cast<int>(sizes.size() * 3));
}

// Many small pieces: a piece that starts and ends inside one block, and carries of a partial
// block many times in a row (pieces of 1-40 bytes, or single bytes), additional data of every
// length up to 40, texts up to 2000 bytes; one key for many messages, as a connection keeps it.
void small_pieces(gcm::Engine e) {
  std::mt19937_64 rng(0x6a09e667f3bcc908ull);
  const Bytes key = random_bytes(16, rng);
  auto k = cipher(e, key);
  for (int c = 0; c < 600; ++c) {
    const size_t size = rng() % 2001, aad_len = c < 41 ? static_cast<size_t>(c) : rng() % 41;
    const Bytes nonce = random_bytes(12, rng);
    const Bytes aad = random_bytes(aad_len, rng), plain = random_bytes(size, rng);
    const size_t most = c % 3 == 0 ? 1 : 40;
    Cut cut;
    for (size_t at = 0; at < size;) {
      const size_t n = std::min(size - at, 1 + rng() % most);
      cut.emplace_back(at, n);
      at += n;
    }
    const bool in_place = c % 2 == 1;
    INFO(gcm::engine_name(e) << ", case " << c << ": size " << size << ", aad " << aad_len << ", pieces "
                             << cut.size() << (in_place ? ", in place" : ""));
    const Sealed want = openssl_seal(key, nonce, aad, plain);
    const Sealed got = seal(*k, nonce, aad, plain, cut, in_place);
    REQUIRE(got.text == want.text);
    REQUIRE(got.tag == want.tag);
    Bytes opened;
    REQUIRE(open(*k, nonce, aad, want.text, want.tag, cut, &opened));
    REQUIRE(opened == plain);
  }
}

// How fast one 16 KiB record (5 bytes of additional data, as a TLS record's header) seals and
// opens, in this thread's CPU seconds (a busy host's other jobs do not count).
double rate(size_t bytes, size_t times, const std::function<void()>& one) {
  timespec t0{}, t1{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  for (size_t i = 0; i < times; ++i) one();
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
  const double s = static_cast<double>(t1.tv_sec - t0.tv_sec) + static_cast<double>(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  return static_cast<double>(bytes * times) / s / 1e9;
}

}  // namespace

TEST_CASE("OpenSSL's AES-128-GCM gives the GCM specification's ciphertexts and tags", "[tls][gcm]") {
  specification_cases(gcm::Engine::kOpenSsl);
}

TEST_CASE("OpenSSL's AES-128-GCM in pieces seals as one call, and refuses any flipped bit", "[tls][gcm]") {
  random_cases(gcm::Engine::kOpenSsl);
  small_pieces(gcm::Engine::kOpenSsl);
}

TEST_CASE("ipsec-mb's AES-128-GCM gives the GCM specification's ciphertexts and tags", "[ipsec-mb]") {
  std::string detail;
  REQUIRE(gcm::ipsec_mb_usable(&detail, nullptr));
  INFO(detail);
  specification_cases(gcm::Engine::kIpsecMb);
}

TEST_CASE("ipsec-mb's AES-128-GCM seals as OpenSSL does, opens OpenSSL's records and refuses any flipped bit",
          "[ipsec-mb]") {
  REQUIRE(gcm::ipsec_mb_usable(nullptr, nullptr));
  random_cases(gcm::Engine::kIpsecMb);
  small_pieces(gcm::Engine::kIpsecMb);
}

// Not a test: `unit_tests "[.aes-benchmark]" -s`. OpenSSL's EVP and, where it loads, ipsec-mb.
TEST_CASE("AES-128-GCM engines on 16 KiB records", "[.aes-benchmark]") {
  const size_t kRecord = 16384, kRecords = 20000;
  std::mt19937_64 rng(1);
  const Bytes key = random_bytes(16, rng), nonce = random_bytes(12, rng), aad = random_bytes(5, rng);
  const Bytes plain = random_bytes(kRecord + 1, rng);
  Bytes out(kRecord + 1 + 16);
  std::string detail;
  const bool ipsec = gcm::ipsec_mb_usable(&detail, nullptr);
  std::printf("ipsec-mb: %s\n", detail.c_str());
  for (int round = 0; round < 3; ++round) {
    for (const gcm::Engine e : {gcm::Engine::kOpenSsl, gcm::Engine::kIpsecMb}) {
      if (e == gcm::Engine::kIpsecMb && !ipsec) continue;
      auto k = cipher(e, key);
      const double sealed = rate(kRecord, kRecords, [&] {
        k->begin(nonce.data(), aad.data(), 5);
        k->encrypt(plain.data(), out.data(), kRecord + 1);
        k->seal_tag(out.data() + kRecord + 1);
      });
      const double opened = rate(kRecord, kRecords, [&] {
        k->begin(nonce.data(), aad.data(), 5);
        k->decrypt(plain.data(), out.data(), kRecord + 1);
        k->open_tag(out.data() + kRecord + 1);
      });
      std::printf("16 KiB records, %-8s seal %.2f GB/s, open %.2f GB/s\n", gcm::engine_name(e), sealed, opened);
    }
  }
  SUCCEED();
}

// The VAES AES-128-GCM of libcomm's TLS records (libcomm/base/tls/aes_gcm_vaes.h) against OpenSSL's
// EVP AES-128-GCM, byte for byte: random keys, nonces, additional data and texts of every length
// that cuts the eight-block loop, the single blocks and a partial block differently, split into
// pieces at random points as a record's iovecs split them; the published AES-128 test cases of the
// GCM specification (McGrew and Viega, test cases 2-4); and a flipped bit anywhere refused.
// On a CPU without VAES the code is never chosen, and these cases say so and pass.
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <time.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tls/aes_gcm_vaes.h"

using comm::tls::gcm::Key;
using comm::tls::gcm::Stream;

namespace {

using Bytes = std::vector<uint8_t>;

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

// The text cut into 1-3 pieces at the given points (each <= size), as seal() walks its iovecs.
std::vector<std::pair<size_t, size_t>> pieces(size_t size, std::mt19937_64& rng) {
  std::vector<size_t> cuts = {0, size};
  const int extra = static_cast<int>(rng() % 3);
  for (int i = 0; i < extra; ++i) cuts.push_back(size == 0 ? 0 : rng() % (size + 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) out.emplace_back(cuts[i], cuts[i + 1] - cuts[i]);
  return out;
}

Sealed vaes_seal(const Key& k, const Bytes& nonce, const Bytes& aad, const Bytes& plain,
                 const std::vector<std::pair<size_t, size_t>>& cut, bool in_place) {
  Sealed s;
  s.text = in_place ? plain : Bytes(plain.size());
  s.tag.resize(16);
  Stream gcm(k, nonce.data(), aad.data(), aad.size());
  for (const auto& [at, n] : cut) gcm.encrypt((in_place ? s.text.data() : plain.data()) + at, s.text.data() + at, n);
  gcm.tag(s.tag.data());
  return s;
}

// Opens as records.cc does: decrypt, then the tag compared in constant time.
bool vaes_open(const Key& k, const Bytes& nonce, const Bytes& aad, const Bytes& text, const Bytes& tag,
               const std::vector<std::pair<size_t, size_t>>& cut, Bytes* plain) {
  plain->assign(text.size(), 0);
  Stream gcm(k, nonce.data(), aad.data(), aad.size());
  for (const auto& [at, n] : cut) gcm.decrypt(text.data() + at, plain->data() + at, n);
  uint8_t got[16];
  gcm.tag(got);
  return CRYPTO_memcmp(got, tag.data(), 16) == 0;
}

Bytes random_bytes(size_t n, std::mt19937_64& rng) {
  Bytes b(n);
  for (auto& c : b) c = static_cast<uint8_t>(rng());
  return b;
}

bool skip_without_vaes() {
  if (comm::tls::gcm::cpu_has_vaes()) return false;
  WARN("this CPU has no VAES/VPCLMULQDQ (or the OS does not save ymm): the VAES AES-GCM is never used here, "
       "nothing to test");
  SUCCEED();
  return true;
}

}  // namespace

TEST_CASE("VAES AES-128-GCM gives the GCM specification's ciphertexts and tags (test cases 2-4)", "[tls][aes]") {
  if (skip_without_vaes()) return;
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
    const Bytes plain = hex(i == 2 ? p4 : c.plain), cipher = hex(i == 2 ? c4 : c.cipher), tag = hex(c.tag);
    Key k;
    comm::tls::gcm::expand_key(&k, key.data());
    const Sealed s = vaes_seal(k, iv, aad, plain, {{0, plain.size()}}, false);
    INFO("test case " << i + 2);
    CHECK(s.text == cipher);
    CHECK(s.tag == tag);
    Bytes opened;
    CHECK(vaes_open(k, iv, aad, cipher, tag, {{0, cipher.size()}}, &opened));
    CHECK(opened == plain);
  }
}

TEST_CASE("VAES AES-128-GCM seals as OpenSSL does, opens OpenSSL's records and refuses any flipped bit",
          "[tls][aes]") {
  if (skip_without_vaes()) return;
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<size_t> sizes = {0,   1,   15,  16,   17,   31,    32,    33,    127,  128,
                               129, 255, 256, 257,  1000, 4095,  16383, 16384, 16385};
  for (int i = 0; i < 150; ++i) sizes.push_back(rng() % 16386);
  int checked = 0;
  for (const size_t size : sizes) {
    for (const size_t aad_len : {size_t{0}, size_t{5}, size_t{13}}) {
      const Bytes key = random_bytes(16, rng), nonce = random_bytes(12, rng);
      const Bytes aad = random_bytes(aad_len, rng), plain = random_bytes(size, rng);
      Key k;
      comm::tls::gcm::expand_key(&k, key.data());
      const auto cut = pieces(size, rng);
      const bool in_place = rng() % 4 == 0;
      INFO("size " << size << ", aad " << aad_len << ", pieces " << cut.size() << (in_place ? ", in place" : ""));
      const Sealed want = openssl_seal(key, nonce, aad, plain);
      const Sealed got = vaes_seal(k, nonce, aad, plain, cut, in_place);
      REQUIRE(got.text == want.text);
      REQUIRE(got.tag == want.tag);
      Bytes opened;
      REQUIRE(vaes_open(k, nonce, aad, want.text, want.tag, pieces(size, rng), &opened));
      REQUIRE(opened == plain);
      // One bit flipped in the ciphertext, the tag or the additional data: refused.
      if (size > 0) {
        Bytes bad = want.text;
        bad[rng() % size] ^= static_cast<uint8_t>(1u << (rng() % 8));
        CHECK_FALSE(vaes_open(k, nonce, aad, bad, want.tag, pieces(size, rng), &opened));
      }
      Bytes bad_tag = want.tag;
      bad_tag[rng() % 16] ^= static_cast<uint8_t>(1u << (rng() % 8));
      CHECK_FALSE(vaes_open(k, nonce, aad, want.text, bad_tag, cut, &opened));
      if (aad_len > 0) {
        Bytes bad_aad = aad;
        bad_aad[rng() % aad_len] ^= static_cast<uint8_t>(1u << (rng() % 8));
        CHECK_FALSE(vaes_open(k, nonce, bad_aad, want.text, want.tag, cut, &opened));
      }
      ++checked;
    }
  }
  CHECK(checked == static_cast<int>(sizes.size() * 3));
}

// Many small pieces: a piece that starts and ends inside one block, and carries of a partial
// block many times in a row (pieces of 1-40 bytes, or single bytes), additional data of every
// length up to 40, texts up to 2000 bytes (the eight-block loop entered and left at every phase).
// Also the tag asked twice, and asked in the middle: it is the tag of the text so far each time.
TEST_CASE("VAES AES-128-GCM matches OpenSSL when the text comes in many small pieces", "[tls][aes]") {
  if (skip_without_vaes()) return;
  std::mt19937_64 rng(0x6a09e667f3bcc908ull);
  for (int c = 0; c < 600; ++c) {
    const size_t size = rng() % 2001, aad_len = c < 41 ? static_cast<size_t>(c) : rng() % 41;
    const Bytes key = random_bytes(16, rng), nonce = random_bytes(12, rng);
    const Bytes aad = random_bytes(aad_len, rng), plain = random_bytes(size, rng);
    Key k;
    comm::tls::gcm::expand_key(&k, key.data());
    const size_t most = c % 3 == 0 ? 1 : 40;
    std::vector<std::pair<size_t, size_t>> cut;
    for (size_t at = 0; at < size;) {
      const size_t n = std::min(size - at, 1 + rng() % most);
      cut.emplace_back(at, n);
      at += n;
    }
    const bool in_place = c % 2 == 1;
    INFO("case " << c << ": size " << size << ", aad " << aad_len << ", pieces " << cut.size()
                 << (in_place ? ", in place" : ""));
    const Sealed want = openssl_seal(key, nonce, aad, plain);
    const Sealed got = vaes_seal(k, nonce, aad, plain, cut, in_place);
    REQUIRE(got.text == want.text);
    REQUIRE(got.tag == want.tag);
    Bytes opened;
    REQUIRE(vaes_open(k, nonce, aad, want.text, want.tag, cut, &opened));
    REQUIRE(opened == plain);
    // tag() leaves the stream as it was: asked twice, the same; asked halfway, the half's tag, and
    // the stream then goes on to the whole text's.
    const size_t half = size / 2;
    const Bytes first(plain.begin(), plain.begin() + static_cast<long>(half));
    Bytes text(size);
    Stream gcm(k, nonce.data(), aad.data(), aad.size());
    gcm.encrypt(plain.data(), text.data(), half);
    uint8_t t1[16], t2[16];
    gcm.tag(t1);
    gcm.tag(t2);
    CHECK(Bytes(t1, t1 + 16) == openssl_seal(key, nonce, aad, first).tag);
    CHECK(Bytes(t2, t2 + 16) == Bytes(t1, t1 + 16));
    gcm.encrypt(plain.data() + half, text.data() + half, size - half);
    gcm.tag(t2);
    CHECK(text == want.text);
    CHECK(Bytes(t2, t2 + 16) == want.tag);
  }
}

// Not a test: how fast one 16 KiB record (5 bytes of additional data, as a TLS record's header)
// seals and opens here, in this thread's CPU seconds, against OpenSSL's EVP. `unit_tests "[.aes-benchmark]" -s`.
TEST_CASE("VAES AES-128-GCM against OpenSSL on 16 KiB records", "[.aes-benchmark]") {
  if (skip_without_vaes()) return;
  const size_t kRecord = 16384, kRecords = 20000;
  std::mt19937_64 rng(1);
  const Bytes key = random_bytes(16, rng), nonce = random_bytes(12, rng), aad = random_bytes(5, rng);
  const Bytes plain = random_bytes(kRecord + 1, rng);
  Bytes out(kRecord + 1 + 16);
  Key k;
  comm::tls::gcm::expand_key(&k, key.data());
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  REQUIRE(EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), nullptr, key.data(), nullptr) == 1);
  auto rate = [&](auto&& one) {
    // This thread's CPU time, not the wall clock: a busy host's other jobs do not count.
    timespec t0{}, t1{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (size_t i = 0; i < kRecords; ++i) one();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    const double s = static_cast<double>(t1.tv_sec - t0.tv_sec) + static_cast<double>(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    return static_cast<double>(kRecord * kRecords) / s / 1e9;
  };
  for (int round = 0; round < 3; ++round) {
    const double ossl = rate([&] {
      int outl = 0;
      EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce.data());
      EVP_EncryptUpdate(ctx, nullptr, &outl, aad.data(), 5);
      EVP_EncryptUpdate(ctx, out.data(), &outl, plain.data(), static_cast<int>(kRecord + 1));
      EVP_EncryptFinal_ex(ctx, out.data() + kRecord + 1, &outl);
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, out.data() + kRecord + 1);
    });
    const double seal = rate([&] {
      Stream gcm(k, nonce.data(), aad.data(), 5);
      gcm.encrypt(plain.data(), out.data(), kRecord + 1);
      gcm.tag(out.data() + kRecord + 1);
    });
    const double open = rate([&] {
      Stream gcm(k, nonce.data(), aad.data(), 5);
      gcm.decrypt(plain.data(), out.data(), kRecord + 1);
      gcm.tag(out.data() + kRecord + 1);
    });
    std::printf("16 KiB records: OpenSSL EVP seal %.2f GB/s, VAES seal %.2f GB/s, VAES open %.2f GB/s\n", ossl, seal,
                open);
  }
  EVP_CIPHER_CTX_free(ctx);
  SUCCEED();
}

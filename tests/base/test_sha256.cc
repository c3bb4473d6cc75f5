// SHA-256 against FIPS 180-4's examples and HMAC-SHA256 against RFC 4231's test cases 1-7: our
// thin wrappers over OpenSSL's libcrypto (crypto/sha256.h), so a wrong call shows here.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "crypto/sha256.h"

using namespace comm;

namespace {

std::string sha_hex(const std::string& s) { return hex(sha256(s.data(), s.size())); }

std::string hmac_hex(const std::vector<uint8_t>& key, const std::string& msg) {
  return hex(hmac_sha256(key.data(), key.size(), msg.data(), msg.size()));
}

std::vector<uint8_t> bytes(size_t n, uint8_t b) { return std::vector<uint8_t>(n, b); }
std::string text(size_t n, char c) { return std::string(n, c); }

}  // namespace

TEST_CASE("sha256 matches the FIPS 180-4 examples", "[crypto][sha256]") {
  CHECK(sha_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmn"
                "opqrsmnopqrstnopqrstu") ==
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  CHECK(sha_hex(std::string(1000000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("hmac_sha256 matches RFC 4231 test cases 1-7", "[crypto][sha256]") {
  CHECK(hmac_hex(bytes(20, 0x0b), "Hi There") ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(hmac_hex({'J', 'e', 'f', 'e'}, "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(hmac_hex(bytes(20, 0xaa), text(50, '\xdd')) ==
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::vector<uint8_t> key4;
  for (uint8_t b = 1; b <= 25; ++b) key4.push_back(b);
  CHECK(hmac_hex(key4, text(50, '\xcd')) ==
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Test case 5 is truncated to 128 bits in the RFC: its first 32 hex digits.
  CHECK(hmac_hex(bytes(20, 0x0c), "Test With Truncation").substr(0, 32) ==
        "a3b6167473100ee06e0c796c2955552b");
  CHECK(hmac_hex(bytes(131, 0xaa), "Test Using Larger Than Block-Size Key - Hash Key First") ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(hmac_hex(bytes(131, 0xaa),
                 "This is a test using a larger than block-size key and a larger than block-size data. "
                 "The key needs to be hashed before being used by the HMAC algorithm.") ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST_CASE("digest_equal tells every differing byte", "[crypto][sha256]") {
  Digest a = sha256("abc", 3);
  CHECK(digest_equal(a, a));
  for (size_t i = 0; i < a.size(); ++i) {
    Digest b = a;
    b[i] ^= 1;
    CHECK_FALSE(digest_equal(a, b));
  }
}

TEST_CASE("hmac_sha256 with an empty key and message is HMAC's, not the previous key's", "[crypto][sha256]") {
  CHECK(hex(hmac_sha256(nullptr, 0, "", 0)) == "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
  // A key used just before must not leak into a keyless call.
  (void)hmac_sha256("key", 3, "x", 1);
  CHECK(hex(hmac_sha256(nullptr, 0, "", 0)) == "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
}

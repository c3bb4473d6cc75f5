// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104) for proving a shared secret (COMM_AUTH_TOKEN,
// the job secret) and the init verdict's digest: thin wrappers over OpenSSL's libcrypto, which
// every supported host has and which has FIPS-validated builds; we ship no crypto of our own.
// Tests: tests/base/test_sha256.cc (FIPS 180-4's examples, RFC 4231's vectors).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace comm {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const void* data, size_t n);
Digest hmac_sha256(const void* key, size_t key_len, const void* msg, size_t msg_len);
// Lower-case hex, 64 characters.
std::string hex(const Digest& d);
// Compares every byte whatever the first difference, so that the time taken tells an attacker
// nothing about how much of a forged proof was right.
bool digest_equal(const Digest& a, const Digest& b);

}  // namespace comm

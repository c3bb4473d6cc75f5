// Fuzz target: the TCP store's request framing (libcomm/base/store/tcp_store_wire.h), read as
// its server reads a connection: a 16-byte header checked by check_request_header, then the key
// and value it announces, request after request. Checked: an accepted header never announces
// more than the limits; a request that encode_request makes is accepted with its own lengths.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_check.h"
#include "store/tcp_store_wire.h"

using namespace comm::tcp_store;


extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  size_t at = 0;
  while (size - at >= kRequestHeaderBytes) {
    RequestHeader h;
    const std::string why = check_request_header(p + at, &h);
    if (!why.empty()) break;  // the server drops the connection here
    FUZZ_CHECK(h.key_len <= kMaxKeyBytes && h.value_len <= kMaxValueBytes);
    at += kRequestHeaderBytes;
    const size_t body = static_cast<size_t>(h.key_len) + h.value_len;
    if (size - at < body) break;  // the server waits for the rest
    const std::string key(p + at, h.key_len);
    const std::string value(p + at + h.key_len, h.value_len);
    at += body;
    if (h.op == Op::kHello) {
      FUZZ_CHECK(value.size() == 4 || value.size() == 8);  // the version, then (COMM_TLS) the flags
      (void)get_u32(value.data());
    }
    if (h.op == Op::kProof) FUZZ_CHECK(key.empty() && value.size() == comm::kDigestBytes);
    if (h.op == Op::kAdd) {
      FUZZ_CHECK(value.size() == 8);
      (void)get_u64(value.data());
    }
    FUZZ_CHECK(check_sizes(key, value.size()).ok());
    // The same request encoded again reads back alike.
    const std::string again = encode_request(h.op, key, value);
    RequestHeader h2;
    FUZZ_CHECK(check_request_header(again.data(), &h2).empty());
    FUZZ_CHECK(h2.op == h.op && h2.key_len == h.key_len && h2.value_len == h.value_len);
  }
  return 0;
}

// The TCP store's wire format and the socket helpers its server and client share.
//
// Every frame starts with a magic number, so a stray connection (a port scanner, a wrong
// MASTER_PORT pointing at another service) is recognised at once and dropped. All integers
// are big-endian. Lengths are bounded before anything is buffered.
//
//   request:  u32 magic | u8 op | u8 0 | u16 0 | u32 key_len | u32 value_len | key | value
//   response: u32 magic | u8 reply | u8 0 | u16 0 | u32 payload_len | payload
//
// The first request on a connection is kHello: value = u32 protocol version; key = empty, or
// when the client has an auth token (COMM_AUTH_TOKEN) a fresh client nonce. The token itself
// never goes on the wire (crypto/proof.h):
//   - version differs: kVersionMismatch (payload: the server's version), closed;
//   - the server has no token: kOk, and the client with a token gives up (nobody proved it);
//   - the server has a token, the hello no nonce: kAuthRefused, closed;
//   - else kChallenge (payload: the server nonce); the client sends kProof (value: its proof,
//     32 bytes) and the server answers kOk (payload: its own proof) or kAuthRefused, closed.
// Until kOk a connection may send only these hello-sized frames. A connection the server closes
// before its hello was accepted (too many waiting, or no hello or proof within the deadline) is
// first sent kBusy (payload: why), and its client retries on a new connection.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "crypto/proof.h"
#include "deadline.h"
#include "posix/fd.h"
#include "posix/net_util.h"
#include "status.h"
#include "store/store.h"
#include "tls/tls.h"

namespace comm::tcp_store {

inline constexpr uint32_t kMagic = 0x434d5354;  // "CMST"
// 2: the token proven by challenge-response (kChallenge, kProof), never sent.
inline constexpr uint32_t kProtocolVersion = 2;
inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kMaxValueBytes = size_t{64} << 20;
inline constexpr size_t kRequestHeaderBytes = 16;
inline constexpr size_t kResponseHeaderBytes = 12;

enum class Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kAdd = 4, kProof = 5 };
enum class Reply : uint8_t {
  kOk = 0,
  kAuthRefused = 1,
  kVersionMismatch = 2,
  kError = 3,
  kChallenge = 4,
  kBusy = 5,
  kTlsMismatch = 6,  // COMM_TLS differs between the client and the server (payload "0" or "1": the server's)
};

// How every kBusy payload starts, so a client can tell "closed for room, retry" in its log.
inline constexpr std::string_view kBusyPrefix = "rank 0's store closed the connection";
// The hello's flags (the u32 after the version; a hello of 4 bytes has none).
inline constexpr uint32_t kHelloTls = 1;  // COMM_TLS=1: after kOk, a TLS handshake, then every frame as TLS records

// Binds the store's proofs to this protocol (proof_of_secret's context).
inline constexpr std::string_view kProofContext = "libcomm store";

struct RequestHeader {
  Op op = Op::kHello;
  uint32_t key_len = 0;
  uint32_t value_len = 0;
};

void put_u32(std::string* out, uint32_t v);
void put_u64(std::string* out, uint64_t v);
uint32_t get_u32(const char* p);
uint64_t get_u64(const char* p);

std::string encode_request(Op op, std::string_view key, std::string_view value);
std::string encode_response(Reply reply, std::string_view payload);

// Checks a request header (kRequestHeaderBytes at p). Returns "" when it is well formed,
// otherwise why it is not (for the log line that goes with dropping the connection).
std::string check_request_header(const char* p, RequestHeader* out);

// Key and value limits, the same for the server, its clients and rank 0 itself.
Status check_sizes(const std::string& key, size_t value_size);

// "host:port", with brackets around an IPv6 literal.
std::string host_port_string(const std::string& host, int port);

// Blocking-with-deadline I/O on a non-blocking socket (client side).
enum class Io { kOk, kTimeout, kClosed, kError };
Io send_all(int fd, std::string_view data, Deadline deadline, int* err);
Io recv_exact(int fd, char* buf, size_t n, Deadline deadline, int* err);
// The same through a TLS session on fd (COMM_TLS; tls/tls.h); tls null: plaintext.
Io send_all(int fd, tls::Session* tls, std::string_view data, Deadline deadline, int* err);
Io recv_exact(int fd, tls::Session* tls, char* buf, size_t n, Deadline deadline, int* err);

// A client's connection: the socket, and its TLS session under COMM_TLS.
struct Channel {
  posix::Fd fd;
  std::unique_ptr<tls::Session> tls;  // destroyed before fd closes
  int get() const { return fd.get(); }
  bool valid() const { return fd.valid(); }
};

// The server half (tcp_store_server.cc) and the client half (tcp_store.cc).
Status start_server(const TcpStoreOptions& options, std::shared_ptr<Store>* out);
int server_port(const Store& store);  // -1 when store is not a server
Status connect_client(const TcpStoreOptions& options, std::shared_ptr<Store>* out);

}  // namespace comm::tcp_store

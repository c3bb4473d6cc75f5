// Rank 0's side of the TCP store, shared by its three files:
//   tcp_store_server.cc     serving: the poll loop, requests, parked gets (the Store interface);
//   tcp_store_admission.cc  who gets in: accepting, the hello and its proof, strangers, shedding;
//   tcp_store_listen.cc     opening the port (start_server).
//
// Before its hello is accepted a connection is a stranger: it may send only a hello and, when
// the job has an auth token, the proof that answers the server's challenge (tcp_store_wire.h;
// a few KiB, read no further than that), within TcpStoreOptions::hello_timeout_ms. Otherwise
// anyone who reaches the port could make rank 0 buffer 64 MiB per connection, or hold its
// descriptors until accept() fails and the job dies. How many strangers are kept, and which
// one goes when there are too many, is tcp_store_admission.cc's to say.
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "store/tcp_store_wire.h"
#include "tls/tls.h"

namespace comm::tcp_store {

struct Conn {
  posix::Fd fd;
  std::string peer;
  std::string in;  // received, not yet handled (from in_done on)
  size_t in_done = 0;
  std::string out;  // to send (from out_done on)
  size_t out_done = 0;
  bool greeted = false;     // hello accepted (and with a token, the client's proof checked)
  bool challenged = false;  // kChallenge sent: the proof may come
  Nonce client_nonce{};
  Nonce server_nonce{};
  Clock::time_point hello_by{};  // dropped when not greeted by then
  bool asked = false;            // sent a request after its hello: shed() may close it from then on
  bool parked = false;           // a get waits for parked_key
  std::string parked_key;
  bool dead = false;
  bool tls_next = false;  // COMM_TLS: greeted; the TLS handshake starts once the kOk is out
  bool tls_handshaking = false;
  short tls_events = POLLIN;  // what the handshake waits for
  std::unique_ptr<tls::Session> tls;  // after the handshake, every frame through it (tcp_store_tls.cc)

  bool pending_out() const { return out_done < out.size(); }
  // Read already by TLS, so poll() would not report it: the server must look without waiting.
  bool tls_buffered() const { return tls && !tls_handshaking && !parked && !pending_out() && tls->pending(); }
  bool stranger() const { return !dead && !greeted; }
  // A stranger that has sent nothing yet: a rank's hello follows its connect at once, so a
  // silent connection is the first to go when strangers are too many (tcp_store_admission.cc).
  bool silent() const { return stranger() && !challenged && in.empty(); }
};

class Server final : public Store {
 public:
  Server(posix::Fd listen_fd, posix::Fd wake_fd, int port, std::string where, const TcpStoreOptions& options);
  ~Server() override;

  Status start_thread();
  int port() const { return port_; }
  bool dies_with_rank0() const override { return true; }
  std::string reach_address() const override { return host_; }

  using Store::set;  // the set with a deadline: this store waits on no other process
  Status set(const std::string& key, const std::string& value) override;
  Status get(const std::string& key, std::string* value, Deadline deadline) override;
  Status add(const std::string& key, int64_t delta, int64_t* result) override;

 private:
  // ---- the data, shared with in-process callers (tcp_store_server.cc) ----
  void store_value(const std::string& key, const std::string& value);
  Status add_value(const std::string& key, int64_t delta, int64_t* result);
  bool lookup(const std::string& key, std::string* value);
  void wake();

  // ---- the server thread; everything below touches conns_ from it only ----
  void run();
  void handle(Conn& c, short revents);
  void closed(Conn& c, const char* why);  // the peer went: normal
  void drop(Conn& c, const std::string& why);  // we close it: logged
  void read_some(Conn& c);
  void flush(Conn& c);
  void reply(Conn& c, Reply r, std::string_view payload);
  void pump(Conn& c);
  void handle_request(Conn& c, Op op, const std::string& key, const std::string& value);
  void serve_parked();
  size_t live_connections() const;

  // ---- admission (tcp_store_admission.cc) ----
  void accept_all();
  bool make_room();  // false: accepting must pause (nobody can go now)
  bool shed();
  bool evict_silent_stranger(const std::string& why);
  size_t strangers() const;
  Clock::time_point first_hello_deadline() const;
  void drop_late_strangers();
  void hello(Conn& c, const std::string& nonce, uint32_t version, uint32_t flags);
  void proof(Conn& c, const std::string& presented);
  void refuse(Conn& c, const std::string& why);
  void warn_limited(const std::string& what);  // a burst's drops: one WARN, then a count

  // ---- COMM_TLS (tcp_store_tls.cc) ----
  void start_tls(Conn& c);
  void tls_step(Conn& c);

  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, std::string> data_;

  posix::Fd listen_fd_;
  posix::Fd wake_fd_;
  const int port_;
  const std::string where_;
  const std::string token_;
  const std::shared_ptr<tls::Context> tls_;  // COMM_TLS; null: plaintext
  const std::string host_;  // the host it was told to listen on (MASTER_ADDR), "" for any
  const std::chrono::milliseconds hello_timeout_;
  const size_t max_strangers_;  // tcp_store_admission.cc: scales with the world size
  std::atomic<bool> stop_{false};
  std::thread thread_;

  // Server thread only.
  const size_t cap_;  // connections held at once (the descriptor limit less a reserve)
  size_t shed_ = 0;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<char> read_buf_;
  bool check_parked_ = false;
  Clock::time_point accept_resume_{};
  Clock::time_point next_limit_warning_{};
  size_t limited_since_warning_ = 0;
};

// The stranger limit for a store serving `world_size` ranks (tcp_store_admission.cc).
size_t stranger_limit(const TcpStoreOptions& options);
// How many connections the server holds at once (tcp_store_admission.cc).
size_t connection_cap();

}  // namespace comm::tcp_store

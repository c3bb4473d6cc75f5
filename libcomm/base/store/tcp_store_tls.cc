// COMM_TLS on the store server's connections (docs/design/base.md, "Encryption in transit"): the
// greeting (hello, proof, kOk) goes in clear as before, with the client's TLS flag checked in
// the hello (tcp_store_admission.cc); then the TLS handshake, stepped from the poll loop; then
// a kOk through TLS, so the client learns at connect time, not at its first request, that this
// server accepted it (a TLS 1.3 client ends its handshake before the server checks its
// certificate); then every frame through the session (recv_some / send_some).
#include "log.h"
#include "store/tcp_store_server.h"

namespace comm::tcp_store {

void Server::start_tls(Conn& c) {
  c.tls_next = false;
  Status st = tls::Session::create(tls_, c.fd.get(), tls::Role::kServer, &c.tls);
  if (!st.ok()) return drop(c, st.message());
  c.tls_handshaking = true;
  tls_step(c);
}

void Server::tls_step(Conn& c) {
  switch (c.tls->handshake()) {
    case tls::Step::kDone:
      c.tls_handshaking = false;
      COMM_TRACE(kStore, "store server %s: TLS with %s (%s)", where_.c_str(), c.peer.c_str(), c.tls->describe().c_str());
      reply(c, Reply::kOk, "");
      return flush(c);
    case tls::Step::kWantRead:
      c.tls_events = POLLIN;
      return;
    case tls::Step::kWantWrite:
      c.tls_events = POLLOUT;
      return;
    case tls::Step::kFailed:
      return drop(c, c.tls->why());
  }
}

}  // namespace comm::tcp_store

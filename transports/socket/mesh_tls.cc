// COMM_TLS on the socket transport's connections (docs/design/base.md, "Encryption in transit"): the
// libcomm handshake runs as before (the Hello carries kHelloTls, so a peer without TLS is told
// kTlsMismatch and both name the difference), then, on the same descriptor, a TLS 1.3
// handshake, non-blocking like the rest of the mesh: the connection is handed to the transport
// (MeshLink) only when it completes, with its session, and every frame then goes through it.
#include <cerrno>

#include "log.h"
#include "socket/mesh.h"
#include "socket/mesh_states.h"

namespace comm::transport::sock {

Status Mesh::tls_start(TlsPending* t, int fd, bool client) {
  Status st = tls::Session::create(c_.tls, fd, client ? tls::Role::kClient : tls::Role::kServer, &t->session);
  if (!st.ok()) return st.prefixed(me() + ": socket transport: ");
  t->events = client ? POLLOUT : POLLIN;
  return Status::Ok();
}

Mesh::TlsStep Mesh::tls_step(TlsPending* t) {
  switch (t->session->handshake()) {
    case tls::Step::kDone:
      return TlsStep::kDone;
    case tls::Step::kWantRead:
      t->events = POLLIN;
      return TlsStep::kWaiting;
    case tls::Step::kWantWrite:
      t->events = POLLOUT;
      return TlsStep::kWaiting;
    case tls::Step::kFailed:
      break;
  }
  t->why = t->session->why();
  t->session.reset();
  return TlsStep::kFailed;
}

std::string Mesh::tls_refusal(int peer, const std::string& where, const std::string& why) const {
  // Both ends proved the job secret already, so with the PSK (derived from it) the handshake
  // fails only when something in between alters bytes; with certificates, on one the other
  // end's CA did not sign (or none).
  const std::string hint = c_.tls->uses_psk()
                               ? "the bytes were altered in transit, or the peer runs another libcomm"
                               : "is every rank's COMM_TLS_CERT signed by the COMM_TLS_CA of the others?";
  return me() + ": rank " + std::to_string(peer) + " at " + where + ": " + why + " (" + hint + ")";
}

// The acceptor's TLS handshake after its kOk; the slot stays linked meanwhile, so a crossing
// dial is answered as for an up connection.
Status Mesh::tls_accepted(Incoming& in, std::vector<MeshLink>* done) {
  const TlsStep step = tls_step(&in.tls);
  if (step == TlsStep::kWaiting) return Status::Ok();
  const int peer = in.hello.rank, index = static_cast<int>(in.hello.conn_index);
  if (step == TlsStep::kFailed) {
    // The connector reads the alert and fails naming this rank; the slot is free for a new dial.
    linked_[slot(peer, index)] = kNotLinked;
    --connected_;
    drop(in, tls_refusal(peer, in.remote, in.tls.why));
    return Status::Ok();
  }
  const uint64_t ready = kTlsReady;  // into a fresh connection's empty buffer: all or nothing
  if (in.tls.session->write(&ready, sizeof ready) != static_cast<ssize_t>(sizeof ready)) {
    linked_[slot(peer, index)] = kNotLinked;
    --connected_;
    drop(in, "could not be sent the TLS confirmation: " + (errno == EPROTO ? in.tls.session->why() : errno_string(errno)));
    return Status::Ok();
  }
  COMM_INFO(kNet, "%s: rank %d connected (connection #%d, %s; %s)", me().c_str(), peer, index, in.remote.c_str(),
            in.tls.session->describe().c_str());
  done->push_back(MeshLink{peer, index, std::move(in.fd), in.remote, std::move(in.tls.session)});
  return Status::Ok();
}

// The connector's TLS handshake after the kOk: a failure is this rank's to report, naming the peer.
Status Mesh::tls_connected(Outgoing& o, std::vector<MeshLink>* done) {
  const std::string& where = o.where;
  if (!o.tls.handshaken) {
    const TlsStep step = tls_step(&o.tls);
    if (step == TlsStep::kWaiting) return Status::Ok();
    if (step == TlsStep::kFailed) return SystemError(tls_refusal(o.peer, where, o.tls.why));
    o.tls.handshaken = true;
    o.tls.events = POLLIN;
  }
  // The acceptor's kTlsReady, or the alert that says why it refused this rank.
  while (o.tls.ready_got < sizeof o.tls.ready) {
    ssize_t n = o.tls.session->read(reinterpret_cast<char*>(&o.tls.ready) + o.tls.ready_got,
                                    sizeof o.tls.ready - o.tls.ready_got);
    if (n > 0) {
      o.tls.ready_got += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EAGAIN) return Status::Ok();
    const std::string why = n == 0 ? "the peer closed the connection after the TLS handshake"
                            : errno == EPROTO ? o.tls.session->why()
                                              : errno_string(errno);
    return SystemError(tls_refusal(o.peer, where, "refused after the TLS handshake: " + why));
  }
  if (o.tls.ready != kTlsReady)
    return SystemError(tls_refusal(o.peer, where, "sent garbage instead of its TLS confirmation"));
  COMM_INFO(kNet, "%s: connected to rank %d (connection #%d, %s; %s)", me().c_str(), o.peer, o.index, where.c_str(),
            o.tls.session->describe().c_str());
  done->push_back(MeshLink{o.peer, o.index, std::move(o.fd), where, std::move(o.tls.session)});
  o.state = OutState::kDone;
  return Status::Ok();
}

}  // namespace comm::transport::sock

#include "socket/mesh.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"
#include "socket/wire.h"

namespace comm::transport::sock {
namespace {

constexpr size_t kMaxPendingAccepts = 64;  // half-open strangers we keep before shedding the oldest
constexpr int kFirstBackoffMs = 10;
constexpr int kMaxBackoffMs = 500;

enum class OutState { kWaitRetry, kConnecting, kSendHello, kAwaitReply, kDone };

struct Outgoing {
  int peer = 0;
  int index = 0;
  SockAddr addr;
  std::string addr_text;
  std::string hello;  // Hello + secret
  OutState state = OutState::kWaitRetry;
  Fd fd;
  Clock::time_point retry_at{};
  int backoff_ms = kFirstBackoffMs;
  size_t sent = 0;
  Reply reply{};
  size_t got = 0;
  std::string last_error = "not tried yet";
};

struct Incoming {
  Fd fd;
  std::string remote;
  Hello hello{};
  std::string secret;
  size_t got = 0;  // bytes of Hello + secret received so far
};

class MeshBuilder {
 public:
  MeshBuilder(const MeshConfig& config, std::vector<MeshLink>* links) : c_(config), links_(links) {}
  Status run();

 private:
  Status read_addresses();
  void accept_all();
  Status on_incoming(Incoming& in);
  Status validate(Incoming& in);
  bool reply(Incoming& in, ReplyCode code, uint32_t value);
  void drop(Incoming& in, const std::string& why);
  void start_connect(Outgoing& o);
  Status on_outgoing(Outgoing& o);
  Status refused(const Outgoing& o);
  void retry(Outgoing& o, const std::string& why);
  Status timeout_status() const;
  std::string me() const { return c_.label + (c_.label.empty() ? "" : " ") + "rank " + std::to_string(c_.rank); }

  const MeshConfig& c_;
  std::vector<MeshLink>* links_;
  Deadline deadline_ = Deadline::never();
  Fd listener_;
  std::string listen_text_;
  int expected_in_ = 0;
  int connected_in_ = 0;
  size_t done_out_ = 0;
  std::vector<Incoming> incoming_;
  std::vector<Outgoing> outgoing_;
};

Status MeshBuilder::run() {
  deadline_ = Deadline::after_ms(c_.timeout_ms);
  links_->clear();
  links_->resize(static_cast<size_t>(c_.size) * static_cast<size_t>(c_.nconns));
  expected_in_ = (c_.size - 1 - c_.rank) * c_.nconns;

  SockAddr bound;
  Status st = listen_on(c_.host, c_.family, c_.size * c_.nconns + 16, &listener_, &bound);
  if (!st.ok()) return st.prefixed(me() + ": socket transport: ");
  listen_text_ = format_address(bound);
  // Published before anything waits: a test (or an operator's probe) can find it here.
  COMM_RETURN_IF_ERROR(c_.store->set("addr/" + std::to_string(c_.rank), listen_text_));
  COMM_INFO(kNet, "%s: socket transport listening on %s", me().c_str(), listen_text_.c_str());
  COMM_RETURN_IF_ERROR(read_addresses());

  std::vector<pollfd> pfds;
  std::vector<int> owner;  // -1 listener, [0, incoming) incoming, then outgoing
  while (connected_in_ < expected_in_ || done_out_ < outgoing_.size()) {
    Clock::time_point now = Clock::now();
    if (now >= deadline_.at()) return timeout_status();
    pfds.clear();
    owner.clear();
    if (connected_in_ < expected_in_) {
      pfds.push_back({listener_.get(), POLLIN, 0});
      owner.push_back(-1);
    }
    for (size_t i = 0; i < incoming_.size(); ++i) {
      pfds.push_back({incoming_[i].fd.get(), POLLIN, 0});
      owner.push_back(static_cast<int>(i));
    }
    Clock::time_point wake = deadline_.at();
    for (size_t i = 0; i < outgoing_.size(); ++i) {
      Outgoing& o = outgoing_[i];
      if (o.state == OutState::kWaitRetry && now >= o.retry_at) start_connect(o);
      short events = 0;
      if (o.state == OutState::kWaitRetry) wake = std::min(wake, o.retry_at);
      if (o.state == OutState::kConnecting || o.state == OutState::kSendHello) events = POLLOUT;
      if (o.state == OutState::kAwaitReply) events = POLLIN;
      if (events == 0) continue;
      pfds.push_back({o.fd.get(), events, 0});
      owner.push_back(static_cast<int>(incoming_.size() + i));
    }
    auto left_us = std::chrono::duration_cast<std::chrono::microseconds>(wake - now).count();
    int timeout_ms = static_cast<int>(std::clamp<int64_t>((left_us + 999) / 1000, 0, 1000));
    int rc = ::poll(pfds.data(), pfds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) return SystemError(me() + ": poll() failed during setup: " + errno_string(errno));
    if (rc <= 0) continue;

    size_t n_incoming = incoming_.size();
    bool accept_ready = false;
    for (size_t k = 0; k < pfds.size(); ++k) {
      if (pfds[k].revents == 0) continue;
      int who = owner[k];
      if (who < 0) {
        accept_ready = true;
      } else if (static_cast<size_t>(who) < n_incoming) {
        if (incoming_[static_cast<size_t>(who)].fd.valid())
          COMM_RETURN_IF_ERROR(on_incoming(incoming_[static_cast<size_t>(who)]));
      } else {
        COMM_RETURN_IF_ERROR(on_outgoing(outgoing_[static_cast<size_t>(who) - n_incoming]));
      }
    }
    std::erase_if(incoming_, [](const Incoming& in) { return !in.fd.valid(); });
    if (accept_ready) accept_all();
  }
  COMM_INFO(kNet, "%s: socket mesh complete (%d ranks, %d connections per peer)", me().c_str(), c_.size, c_.nconns);
  return Status::Ok();  // the listener and any stranger still pending close here
}

Status MeshBuilder::read_addresses() {
  for (int peer = 0; peer < c_.rank; ++peer) {
    std::string text;
    Status st = c_.store->get("addr/" + std::to_string(peer), &text, deadline_);
    if (!st.ok())
      return Status(st.code(), me() + ": rank " + std::to_string(peer) +
                                   " never published its socket address (did it start?): " + st.message());
    SockAddr addr;
    st = parse_address(text, &addr);
    if (!st.ok()) return Internal(me() + ": rank " + std::to_string(peer) + " published " + st.message());
    for (int index = 0; index < c_.nconns; ++index) {
      Outgoing o;
      o.peer = peer;
      o.index = index;
      o.addr = addr;
      o.addr_text = text;
      Hello h{kHelloMagic, kProtocolVersion, c_.rank, c_.size, static_cast<uint32_t>(index),
              static_cast<uint32_t>(c_.nconns), static_cast<uint32_t>(c_.secret.size())};
      o.hello.assign(reinterpret_cast<const char*>(&h), sizeof h);
      o.hello += c_.secret;
      o.retry_at = Clock::now();
      outgoing_.push_back(std::move(o));
    }
  }
  return Status::Ok();
}

void MeshBuilder::accept_all() {
  for (;;) {
    int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        COMM_WARN(kNet, "%s: accept() failed: %s", me().c_str(), errno_string(errno).c_str());
      return;
    }
    Incoming in;
    in.fd.reset(fd);
    in.remote = peer_address(fd);
    if (incoming_.size() >= kMaxPendingAccepts) {
      drop(incoming_.front(), "too many unfinished handshakes; shedding the oldest");
      incoming_.erase(incoming_.begin());
    }
    incoming_.push_back(std::move(in));
  }
}

Status MeshBuilder::on_incoming(Incoming& in) {
  for (;;) {
    size_t want = sizeof(Hello) + (in.got >= sizeof(Hello) ? in.hello.secret_len : 0);
    if (in.got == want) break;
    char* dst;
    if (in.got < sizeof(Hello)) {
      dst = reinterpret_cast<char*>(&in.hello) + in.got;
    } else {
      in.secret.resize(in.hello.secret_len);
      dst = in.secret.data() + (in.got - sizeof(Hello));
    }
    ssize_t n = ::recv(in.fd.get(), dst, want - in.got, MSG_DONTWAIT);
    if (n == 0) {
      drop(in, "closed the connection before completing the handshake");
      return Status::Ok();
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) drop(in, "handshake read failed: " + errno_string(errno));
      return Status::Ok();
    }
    in.got += static_cast<size_t>(n);
    if (in.got >= sizeof(uint64_t) && in.hello.magic != kHelloMagic) {
      drop(in, "sent garbage (bad handshake magic; not a libcomm peer?)");
      return Status::Ok();
    }
    if (in.got == sizeof(Hello)) {
      if (in.hello.version != kProtocolVersion) {
        reply(in, ReplyCode::kBadVersion, kProtocolVersion);
        drop(in, "speaks wire protocol version " + std::to_string(in.hello.version) + ", this rank " +
                     std::to_string(kProtocolVersion));
        return Status::Ok();
      }
      if (in.hello.secret_len > kMaxSecretBytes) {
        drop(in, "sent garbage (secret length " + std::to_string(in.hello.secret_len) + ")");
        return Status::Ok();
      }
    }
  }
  return validate(in);
}

Status MeshBuilder::validate(Incoming& in) {
  const Hello& h = in.hello;
  if (!posix::constant_time_equal(std::string_view(in.secret.data(), in.secret.size()), c_.secret)) {
    reply(in, ReplyCode::kBadSecret, 0);
    drop(in, "presented a wrong job secret (claimed rank " + std::to_string(h.rank) + ")");
    return Status::Ok();
  }
  // From here on the peer holds this job's secret: a disagreement is the job's misconfiguration.
  std::string who = "rank " + std::to_string(h.rank) + " at " + in.remote;
  if (h.size != c_.size) {
    reply(in, ReplyCode::kSizeMismatch, static_cast<uint32_t>(c_.size));
    drop(in, "has world size " + std::to_string(h.size));
    return InvalidUsage(me() + ": " + who + " has world size " + std::to_string(h.size) + " but this rank has " +
                        std::to_string(c_.size));
  }
  if (h.nconns != static_cast<uint32_t>(c_.nconns)) {
    reply(in, ReplyCode::kNconnsMismatch, static_cast<uint32_t>(c_.nconns));
    drop(in, "uses " + std::to_string(h.nconns) + " connections per peer");
    return InvalidUsage(me() + ": " + who + " uses COMM_SOCKET_NCONNS=" + std::to_string(h.nconns) +
                        " but this rank uses " + std::to_string(c_.nconns) + "; set the same value on every rank");
  }
  if (h.rank <= c_.rank || h.rank >= c_.size || h.conn_index >= h.nconns) {
    reply(in, ReplyCode::kBadRank, 0);
    drop(in, "claimed rank " + std::to_string(h.rank) + " connection #" + std::to_string(h.conn_index) +
                 ", which never connects to this rank");
    return Status::Ok();
  }
  MeshLink& link = (*links_)[static_cast<size_t>(h.rank) * static_cast<size_t>(c_.nconns) + h.conn_index];
  if (link.fd.valid()) {
    reply(in, ReplyCode::kDuplicate, 0);
    drop(in, "claimed rank " + std::to_string(h.rank) + " connection #" + std::to_string(h.conn_index) +
                 ", which is already connected");
    return Status::Ok();
  }
  if (!reply(in, ReplyCode::kOk, 0)) {
    drop(in, "could not be sent the handshake reply: " + errno_string(errno));
    return Status::Ok();
  }
  set_nodelay(in.fd.get());
  link.fd = std::move(in.fd);
  link.remote = in.remote;
  ++connected_in_;
  return Status::Ok();
}

// The socket is fresh and its send buffer empty: 16 bytes go out at once or not at all.
bool MeshBuilder::reply(Incoming& in, ReplyCode code, uint32_t value) {
  Reply r{kReplyMagic, static_cast<uint32_t>(code), value};
  return ::send(in.fd.get(), &r, sizeof r, MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(sizeof r);
}

void MeshBuilder::drop(Incoming& in, const std::string& why) {
  COMM_WARN(kNet, "%s: dropped connection from %s: %s", me().c_str(), in.remote.c_str(), why.c_str());
  in.fd.reset();
}

void MeshBuilder::start_connect(Outgoing& o) {
  o.fd.reset(::socket(o.addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!o.fd.valid()) return retry(o, "socket(): " + errno_string(errno));
  o.sent = 0;
  o.got = 0;
  if (::connect(o.fd.get(), o.addr.get(), o.addr.len) == 0) {
    o.state = OutState::kSendHello;
  } else if (errno == EINPROGRESS || errno == EINTR) {
    o.state = OutState::kConnecting;
  } else {
    retry(o, "connect(): " + errno_string(errno));
  }
}

Status MeshBuilder::on_outgoing(Outgoing& o) {
  if (o.state == OutState::kConnecting) {
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(o.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      retry(o, "connect(): " + errno_string(err));
      return Status::Ok();
    }
    o.state = OutState::kSendHello;
  }
  if (o.state == OutState::kSendHello) {
    while (o.sent < o.hello.size()) {
      ssize_t n = ::send(o.fd.get(), o.hello.data() + o.sent, o.hello.size() - o.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) retry(o, "sending the handshake: " + errno_string(errno));
        return Status::Ok();
      }
      o.sent += static_cast<size_t>(n);
    }
    o.state = OutState::kAwaitReply;
    o.last_error = "connected, but no handshake reply came (is that rank stuck before its setup?)";
    return Status::Ok();
  }
  if (o.state != OutState::kAwaitReply) return Status::Ok();
  while (o.got < sizeof o.reply) {
    ssize_t n = ::recv(o.fd.get(), reinterpret_cast<char*>(&o.reply) + o.got, sizeof o.reply - o.got, MSG_DONTWAIT);
    if (n == 0) {
      // Shed under load, or the peer is restarting: try again until the deadline.
      retry(o, "the peer closed the connection during the handshake");
      return Status::Ok();
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) retry(o, "reading the handshake reply: " + errno_string(errno));
      return Status::Ok();
    }
    o.got += static_cast<size_t>(n);
  }
  if (o.reply.magic != kReplyMagic) {
    retry(o, "the listener is not a libcomm peer (bad reply magic)");
    return Status::Ok();
  }
  if (o.reply.code != static_cast<uint32_t>(ReplyCode::kOk)) return refused(o);
  set_nodelay(o.fd.get());
  MeshLink& link = (*links_)[static_cast<size_t>(o.peer) * static_cast<size_t>(c_.nconns) +
                             static_cast<size_t>(o.index)];
  link.fd = std::move(o.fd);
  link.remote = o.addr_text;
  o.state = OutState::kDone;
  ++done_out_;
  return Status::Ok();
}

Status MeshBuilder::refused(const Outgoing& o) {
  std::string who = me() + ": rank " + std::to_string(o.peer) + " at " + o.addr_text;
  switch (static_cast<ReplyCode>(o.reply.code)) {
    case ReplyCode::kBadSecret:
      return SystemError(who + " refused this rank's connection: wrong job secret (is the address in the store "
                               "left over from another job?)");
    case ReplyCode::kBadVersion:
      return InvalidUsage(who + " speaks wire protocol version " + std::to_string(o.reply.value) +
                          ", this rank " + std::to_string(kProtocolVersion) + "; use the same libcomm on every rank");
    case ReplyCode::kSizeMismatch:
      return InvalidUsage(who + " has world size " + std::to_string(o.reply.value) + " but this rank has " +
                          std::to_string(c_.size));
    case ReplyCode::kNconnsMismatch:
      return InvalidUsage(who + " uses COMM_SOCKET_NCONNS=" + std::to_string(o.reply.value) +
                          " but this rank uses " + std::to_string(c_.nconns) + "; set the same value on every rank");
    default:
      return Internal(who + " refused connection #" + std::to_string(o.index) + " (reply code " +
                      std::to_string(o.reply.code) + ")");
  }
}

void MeshBuilder::retry(Outgoing& o, const std::string& why) {
  o.fd.reset();
  o.last_error = why;
  o.state = OutState::kWaitRetry;
  o.retry_at = Clock::now() + std::chrono::milliseconds(o.backoff_ms);
  COMM_INFO(kNet, "%s: connection #%d to rank %d at %s failed (%s); retrying in %d ms", me().c_str(), o.index, o.peer,
            o.addr_text.c_str(), why.c_str(), o.backoff_ms);
  o.backoff_ms = std::min(o.backoff_ms * 2, kMaxBackoffMs);
}

Status MeshBuilder::timeout_status() const {
  std::string text = me() + ": socket transport setup timed out after " + std::to_string(c_.timeout_ms) +
                     " ms (listening on " + listen_text_ + ")";
  std::string missing;
  for (int peer = c_.rank + 1; peer < c_.size; ++peer) {
    for (int index = 0; index < c_.nconns; ++index) {
      if ((*links_)[static_cast<size_t>(peer) * static_cast<size_t>(c_.nconns) + static_cast<size_t>(index)]
              .fd.valid())
        continue;
      missing += (missing.empty() ? "" : ", ") + std::to_string(peer);
      break;
    }
  }
  if (!missing.empty()) text += ": rank(s) " + missing + " never connected to this rank";
  int last_peer = -1;
  for (const auto& o : outgoing_) {
    if (o.state == OutState::kDone || o.peer == last_peer) continue;
    last_peer = o.peer;
    text += "; could not connect to rank " + std::to_string(o.peer) + " at " + o.addr_text + " (last error: " +
            o.last_error + ")";
  }
  return Timeout(text);
}

}  // namespace

Status build_mesh(const MeshConfig& config, std::vector<MeshLink>* links) {
  MeshBuilder builder(config, links);
  return builder.run();
}

}  // namespace comm::transport::sock

#include "support/collective_check.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <map>
#include <memory>
#include <thread>

#include "algorithms/scratch.h"
#include "dtype.h"
#include "support/inproc_transport.h"
#include "support/shm_fabric.h"

namespace comm::testing {

using comm::algo::Algorithm;
using comm::algo::CollArgs;

size_t esize(comm_dtype_t dt) { return comm::dtype_size(dt); }

namespace {

// ---- element access ---------------------------------------------------------------------

bool is_float(comm_dtype_t dt) {
  return dt == COMM_FLOAT32 || dt == COMM_FLOAT64 || dt == COMM_FLOAT16 || dt == COMM_BFLOAT16;
}
bool is_signed(comm_dtype_t dt) { return dt == COMM_INT8 || dt == COMM_INT32 || dt == COMM_INT64; }

// Typed access to element i of a buffer, with the dtype's facts looked up once.
struct Access {
  comm_dtype_t dt;
  size_t es;
  bool fl, sg;
  uint64_t mask;

  explicit Access(comm_dtype_t d)
      : dt(d),
        es(esize(d)),
        fl(is_float(d)),
        sg(is_signed(d)),
        mask(es == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * es)) - 1) {}

  uint64_t raw(const void* buf, size_t i) const {
    const char* p = static_cast<const char*>(buf) + i * es;
    uint64_t v = 0;
    switch (es) {  // fixed-size copies, little-endian
      case 1:
        std::memcpy(&v, p, 1);
        break;
      case 2:
        std::memcpy(&v, p, 2);
        break;
      case 4:
        std::memcpy(&v, p, 4);
        break;
      default:
        std::memcpy(&v, p, 8);
        break;
    }
    return v;
  }
  void store_raw(void* buf, size_t i, uint64_t v) const { std::memcpy(static_cast<char*>(buf) + i * es, &v, es); }
  int64_t sext(uint64_t raw) const {
    if (es == 8) return static_cast<int64_t>(raw);
    const uint64_t sign = uint64_t{1} << (8 * es - 1);
    return static_cast<int64_t>((raw ^ sign) - sign);
  }
  double f(const void* buf, size_t i) const {
    const uint64_t v = raw(buf, i);
    switch (dt) {
      case COMM_FLOAT32: {
        float x;
        uint32_t b = static_cast<uint32_t>(v);
        std::memcpy(&x, &b, 4);
        return x;
      }
      case COMM_FLOAT64: {
        double x;
        std::memcpy(&x, &v, 8);
        return x;
      }
      case COMM_FLOAT16:
        return comm::half_to_float(static_cast<uint16_t>(v));
      default:
        return comm::bf16_to_float(static_cast<uint16_t>(v));
    }
  }
  void store_f(void* buf, size_t i, double x) const {
    switch (dt) {
      case COMM_FLOAT32: {
        float y = static_cast<float>(x);
        uint32_t b;
        std::memcpy(&b, &y, 4);
        store_raw(buf, i, b);
        break;
      }
      case COMM_FLOAT64: {
        uint64_t b;
        std::memcpy(&b, &x, 8);
        store_raw(buf, i, b);
        break;
      }
      case COMM_FLOAT16:
        store_raw(buf, i, comm::float_to_half(static_cast<float>(x)));
        break;
      default:
        store_raw(buf, i, comm::float_to_bf16(static_cast<float>(x)));
        break;
    }
  }
  double eps() const {
    switch (dt) {
      case COMM_FLOAT32:
        return std::ldexp(1.0, -23);
      case COMM_FLOAT64:
        return std::ldexp(1.0, -52);
      case COMM_FLOAT16:
        return std::ldexp(1.0, -10);
      default:
        return std::ldexp(1.0, -7);
    }
  }
};

// Element i of rank r's input, a function of (r, i) only: small values, so integer prod
// wraps the same way in every type, and float values that round, so that a different
// association of the same operands shows in the bits.
void fill(const Access& a, comm_op_t op, void* buf, size_t from, size_t to, int rank) {
  for (size_t i = from; i < to; ++i) {
    const unsigned h = static_cast<unsigned>((static_cast<size_t>(rank) * 131u + i * 71u + 17u) % 1000u);
    if (a.fl)
      a.store_f(buf, i, op == COMM_PROD ? 0.75 + (h % 500) / 1000.0 : h / 250.0 - 1.5 + 1.0 / 3.0);
    else if (a.sg)
      a.store_raw(buf, i, static_cast<uint64_t>(static_cast<int64_t>(h % 7) - 3));
    else
      a.store_raw(buf, i, h % 7);
  }
}

// Inputs are cached (a smaller count reads a prefix of a larger one): filling them anew for
// every case would cost more than the collectives under test.
const char* input(comm_dtype_t dt, comm_op_t op, int rank, size_t elems) {
  struct Cache {
    comm_dtype_t dt = COMM_FLOAT32;
    bool valid = false;
    std::vector<char> data[8];
    size_t elems[8] = {};
  };
  static Cache cache[2];  // prod's inputs differ from the others'
  Cache& c = cache[op == COMM_PROD ? 1 : 0];
  if (!c.valid || c.dt != dt) {
    c = Cache{};
    c.dt = dt;
    c.valid = true;
  }
  if (elems > c.elems[rank]) {
    Access a(dt);
    c.data[rank].resize(elems * a.es);
    fill(a, op, c.data[rank].data(), 0, elems, rank);
    c.elems[rank] = elems;
  }
  return c.data[rank].data();
}

// The reference reduction of elements [0, len) over n ranks' inputs: float64 value and
// tolerance for floats, the wrapped raw bits for integers. Cached like the inputs.
struct Expected {
  comm_dtype_t dt = COMM_FLOAT32;
  comm_op_t op = COMM_SUM;
  int n = 0;
  size_t len = 0;
  std::vector<double> val, tol;
  std::vector<uint64_t> raw;
};

const Expected& expected(comm_dtype_t dt, comm_op_t op, int n, size_t len) {
  static Expected e;
  if (e.n == n && e.dt == dt && e.op == op && e.len >= len) return e;
  const Access a(dt);
  std::vector<const char*> in(n);
  for (int r = 0; r < n; ++r) in[r] = input(dt, op, r, len);
  e = Expected{};
  e.dt = dt;
  e.op = op;
  e.n = n;
  e.len = len;
  if (a.fl) {
    e.val.resize(len);
    e.tol.resize(len);
    const bool exact = op == COMM_MIN || op == COMM_MAX;
    for (size_t i = 0; i < len; ++i) {
      double acc = a.f(in[0], i), mag = std::fabs(acc);
      for (int r = 1; r < n; ++r) {
        const double x = a.f(in[r], i);
        switch (op) {
          case COMM_PROD:
            acc *= x;
            mag *= std::fabs(x);
            break;
          case COMM_MIN:
            acc = std::min(acc, x);
            break;
          case COMM_MAX:
            acc = std::max(acc, x);
            break;
          default:
            acc += x;
            mag += std::fabs(x);
            break;
        }
      }
      if (op == COMM_AVG) {
        acc /= n;
        mag /= n;
      }
      e.val[i] = acc;
      // One rounding per step (n-1) plus avg's division: within (n+1) epsilons of the magnitude.
      e.tol[i] = exact ? 0.0 : a.eps() * (n + 1) * mag;
    }
  } else {
    e.raw.resize(len);
    for (size_t i = 0; i < len; ++i) {
      uint64_t acc = a.raw(in[0], i);
      for (int r = 1; r < n; ++r) {
        const uint64_t x = a.raw(in[r], i);
        const bool less = a.sg ? a.sext(x) < a.sext(acc) : x < acc;
        switch (op) {
          case COMM_PROD:
            acc = (acc * x) & a.mask;
            break;
          case COMM_MIN:
            acc = less ? x : acc;
            break;
          case COMM_MAX:
            acc = less ? acc : x;
            break;
          default:
            acc = (acc + x) & a.mask;
            break;
        }
      }
      // Integer avg: the wrapped sum, divided, truncated toward zero.
      if (op == COMM_AVG)
        acc = (a.sg ? static_cast<uint64_t>(a.sext(acc) / n) : acc / static_cast<uint64_t>(n)) & a.mask;
      e.raw[i] = acc;
    }
  }
  return e;
}

// "" when got[0, count) matches the reference's [offset, offset + count); else the first
// mismatch and how many there are.
std::string check_reduced(comm_dtype_t dt, comm_op_t op, int n, size_t offset, const void* got, size_t count) {
  const Access a(dt);
  const Expected& e = expected(dt, op, n, offset + count);
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < count; ++i) {
    if (a.fl) {
      const double g = a.f(got, i);
      if (std::fabs(g - e.val[offset + i]) <= e.tol[offset + i]) continue;
      if (bad++ == 0)
        first = "element " + std::to_string(i) + ": got " + std::to_string(g) + " expected " +
                std::to_string(e.val[offset + i]) + " tol " + std::to_string(e.tol[offset + i]);
    } else {
      const uint64_t g = a.raw(got, i);
      if (g == e.raw[offset + i]) continue;
      if (bad++ == 0)
        first = "element " + std::to_string(i) + ": got raw " + std::to_string(g) + " expected raw " +
                std::to_string(e.raw[offset + i]);
    }
  }
  return bad == 0 ? "" : std::to_string(bad) + " wrong, first " + first;
}

uint64_t next_seq() {
  static std::atomic<uint64_t> seq{0};
  return ++seq;
}

// Elements in a rank's input and output buffers.
size_t in_elems(const Case& c) {
  return c.kind == CollKind::kReduceScatter || c.kind == CollKind::kAlltoall ? c.count * c.n : c.count;
}
size_t out_elems(const Case& c) {
  return c.kind == CollKind::kAllgather || c.kind == CollKind::kAlltoall ? c.count * c.n : c.count;
}

// Buffers reused from case to case (a fresh 40 MiB per case is mostly page faults).
std::vector<char>& pooled(int which, int rank, size_t bytes) {
  static std::vector<char> pool[2][8];
  pool[which][rank].resize(bytes);
  return pool[which][rank];
}

}  // namespace

// ---- ranks as threads -----------------------------------------------------------------

// One Scratch per rank kept across cases, as a communicator keeps its own.
comm::algo::Scratch& rank_scratch(int rank) {
  static comm::algo::Scratch scratch[8];
  return scratch[rank];
}

bool is_reduction(CollKind k) {
  return k == CollKind::kAllreduce || k == CollKind::kReduce || k == CollKind::kReduceScatter;
}

std::string Case::label() const {
  return std::string(comm::transport::coll_name(kind)) + " algo=" + algo + " " + comm::dtype_name(dt) + " " +
         comm::op_name(op) + " count=" + std::to_string(count) + " ranks=" + std::to_string(n) +
         (in_place ? " in-place" : " out-of-place") + " root=" + std::to_string(root) +
         " chunk=" + std::to_string(chunk);
}

namespace {

// COMM_TEST_WIRE runs every sweep over real transports: the same cases, another wire
// (e.g. COMM_TEST_WIRE=ucx build/tests/unit_tests '[algorithms]').
Wire wire_from_env() {
  const char* v = std::getenv("COMM_TEST_WIRE");
  const std::string w = v ? v : "";
  if (w == "shm") return Wire::kShm;
  if (w == "two_hosts") return Wire::kTwoHosts;
  if (w == "ucx") return Wire::kUcx;
  if (w == "shm_ucx") return Wire::kShmUcx;
  if (w == "socket_ucx") return Wire::kSocketUcx;
  if (w == "ucx_socket") return Wire::kUcxSocket;
  return Wire::kInproc;
}
Wire g_wire = wire_from_env();
std::map<std::pair<Wire, int>, std::vector<std::unique_ptr<transport::Transport>>> g_real;

// Runs body over the cached real transports of this wire and rank count.
RunResult run_real(int n, size_t chunk_bytes, const std::function<Status(Context&, RunResult&)>& body) {
  RunResult res;
  res.status.resize(n);
  res.chosen.resize(n);
  auto& ts = g_real[{g_wire, n}];
  if (ts.empty()) {
    // (hosts, transport inside a host, transport between hosts) per wire.
    Status st;
    switch (g_wire) {
      case Wire::kShm: st = make_real_transports(one_host(n), kTimeoutMs, &ts); break;
      case Wire::kTwoHosts: st = make_real_transports(two_hosts(n), kTimeoutMs, &ts); break;
      case Wire::kUcx: st = make_real_transports(one_host(n), kTimeoutMs, &ts, "ucx", "ucx"); break;
      case Wire::kShmUcx: st = make_real_transports(two_hosts(n), kTimeoutMs, &ts, "shm", "ucx"); break;
      case Wire::kSocketUcx: st = make_real_transports(two_hosts(n), kTimeoutMs, &ts, "socket", "ucx"); break;
      case Wire::kUcxSocket: st = make_real_transports(two_hosts(n), kTimeoutMs, &ts, "ucx", "socket"); break;
      default: st = Internal("run_real: the in-process wire has no real transports"); break;
    }
    if (!st.ok()) {
      ts.clear();
      for (auto& s : res.status) s = st;
      return res;
    }
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Context ctx{*ts[static_cast<size_t>(r)], r, n, rank_scratch(r), chunk_bytes};
      res.status[r] = body(ctx, res);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& st : res.status)
    if (!st.ok()) ts.clear();  // broken: the next case gets fresh ones
  return res;
}

}  // namespace

void set_wire(Wire w) { g_wire = w; }
Wire current_wire() { return g_wire; }
void reset_wire_cache() { g_real.clear(); }

RunResult run_ranks(int n, size_t chunk_bytes, int timeout_ms,
                    const std::function<Status(Context&, RunResult&)>& body) {
  if (g_wire != Wire::kInproc && n > 1) return run_real(n, chunk_bytes, body);
  auto fabric = std::make_shared<comm::testing::InprocFabric>(n);
  RunResult res;
  res.status.resize(n);
  res.chosen.resize(n);
  std::vector<size_t> peak(n), live(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      comm::transport::Options opts;
      opts.rank = r;
      opts.size = n;
      opts.timeout_ms = timeout_ms;
      comm::testing::InprocTransport t(fabric, opts);
      Context ctx{t, r, n, rank_scratch(r), chunk_bytes};
      res.status[r] = body(ctx, res);
      peak[r] = t.peak_outstanding();
      live[r] = t.outstanding();
    });
  }
  for (auto& t : threads) t.join();
  res.peak_requests = *std::max_element(peak.begin(), peak.end());
  res.leftover = fabric->pending();
  for (size_t l : live) res.leftover += l;
  return res;
}

std::string run_case(const Case& c) {
  const int n = c.n;
  const size_t es = esize(c.dt);
  const size_t ib = in_elems(c) * es, ob = out_elems(c) * es, block = c.count * es;
  std::vector<const char*> in(n);
  std::vector<const void*> sendp(n, nullptr);
  std::vector<void*> recvp(n, nullptr);
  std::vector<char*> own_send(n, nullptr);  // out-of-place send buffers, checked unchanged
  for (int r = 0; r < n; ++r) {
    in[r] = input(c.dt, c.op, r, in_elems(c));
    if (c.count == 0) continue;  // NULL buffers are allowed with count 0
    const bool root = r == c.root;
    if (c.in_place) {
      switch (c.kind) {
        case CollKind::kAllgather: {
          char* buf = pooled(1, r, ob).data();
          std::memset(buf, 0xcd, ob);
          std::memcpy(buf + r * block, in[r], block);
          recvp[r] = buf;
          sendp[r] = buf + r * block;
          break;
        }
        case CollKind::kReduceScatter: {
          char* buf = pooled(1, r, ib).data();
          std::memcpy(buf, in[r], ib);
          sendp[r] = buf;
          recvp[r] = buf + r * block;
          break;
        }
        default: {
          char* buf = pooled(1, r, ob).data();
          if (c.kind == CollKind::kBroadcast && !root)
            std::memset(buf, 0xcd, ob);
          else
            std::memcpy(buf, in[r], ob);
          sendp[r] = recvp[r] = buf;
        }
      }
    } else {
      if (c.kind != CollKind::kBroadcast || root) {
        own_send[r] = pooled(0, r, ib).data();
        std::memcpy(own_send[r], in[r], ib);
        sendp[r] = own_send[r];
      }
      if (c.kind != CollKind::kReduce || root) {
        recvp[r] = pooled(1, r, ob).data();
        std::memset(recvp[r], 0xcd, ob);
      }
    }
  }

  comm::transport::OpTag tag;
  tag.seq = next_seq();
  tag.coll = c.kind;
  tag.dtype = static_cast<uint8_t>(c.dt);
  tag.op = static_cast<uint8_t>(c.op);
  tag.root = c.root;
  tag.count = c.count;
  RunResult res = run_ranks(n, c.chunk, kTimeoutMs, [&](Context& ctx, RunResult& out) {
    CollArgs a;
    a.kind = c.kind;
    a.sendbuf = sendp[ctx.rank];
    a.recvbuf = recvp[ctx.rank];
    a.count = c.count;
    a.dtype = c.dt;
    a.op = c.op;
    a.root = c.root;
    a.tag = tag;
    const Algorithm* algo = nullptr;
    COMM_RETURN_IF_ERROR(comm::algo::select(ctx, a, c.algo, &algo));
    out.chosen[ctx.rank] = algo->name;
    return comm::algo::run_collective(ctx, a, c.algo);
  });

  for (int r = 0; r < n; ++r)
    if (!res.status[r].ok()) return "rank " + std::to_string(r) + " failed: " + res.status[r].message();
  const std::string expect = c.expect_algo.empty() ? c.algo : c.expect_algo;
  if (n > 1 && res.chosen[0] != expect) return "select picked " + res.chosen[0] + ", not " + expect;
  if (res.leftover != 0) return std::to_string(res.leftover) + " requests or messages left behind";
  if (res.peak_requests > kMaxRequestsInFlight)
    return std::to_string(res.peak_requests) + " requests in flight at once";
  if (c.count == 0) return res.peak_requests == 0 ? "" : "count 0 moved messages";

  for (int r = 0; r < n; ++r)
    if (own_send[r] != nullptr && std::memcmp(own_send[r], in[r], ib) != 0)
      return "rank " + std::to_string(r) + " sendbuf changed";

  switch (c.kind) {
    case CollKind::kAllreduce:
    case CollKind::kReduce: {
      const int first = c.kind == CollKind::kReduce ? c.root : 0;
      std::string err = check_reduced(c.dt, c.op, n, 0, recvp[first], c.count);
      if (!err.empty()) return "rank " + std::to_string(first) + ": " + err;
      if (c.kind == CollKind::kAllreduce)
        for (int r = 1; r < n; ++r)
          if (std::memcmp(recvp[r], recvp[0], ob) != 0) return "rank " + std::to_string(r) + " differs from rank 0";
      return "";
    }
    case CollKind::kReduceScatter:
      for (int r = 0; r < n; ++r) {
        std::string err = check_reduced(c.dt, c.op, n, r * c.count, recvp[r], c.count);
        if (!err.empty()) return "rank " + std::to_string(r) + ": " + err;
      }
      return "";
    case CollKind::kBroadcast:
      for (int r = 0; r < n; ++r)
        if (std::memcmp(recvp[r], in[c.root], ob) != 0) return "rank " + std::to_string(r) + " differs from root";
      return "";
    case CollKind::kAllgather:
      for (int r = 0; r < n; ++r)
        for (int j = 0; j < n; ++j)
          if (std::memcmp(static_cast<char*>(recvp[r]) + j * block, in[j], block) != 0)
            return "rank " + std::to_string(r) + " block " + std::to_string(j) + " wrong";
      return "";
    case CollKind::kAlltoall:
      for (int r = 0; r < n; ++r)
        for (int j = 0; j < n; ++j)
          if (std::memcmp(static_cast<char*>(recvp[r]) + j * block, in[j] + r * block, block) != 0)
            return "rank " + std::to_string(r) + " block " + std::to_string(j) + " wrong";
      return "";
    default:
      return "unchecked kind";
  }
}

}  // namespace comm::testing

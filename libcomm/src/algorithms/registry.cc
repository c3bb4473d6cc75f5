// The algorithm table and the choice per call: a forced name (COMM_ALGO) when it fits this
// call, else the size rule (latency algorithms up to COMM_SMALL_MSG_BYTES), else the first
// algorithm of this kind, in table order, that can run.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "algorithms/collectives.h"
#include "algorithms/common.h"
#include "log.h"
#include "params.h"

namespace comm::algo {

const std::vector<Algorithm>& registry() {
  static const std::vector<Algorithm> table = {
      ring_allreduce(),
      recursive_doubling_allreduce(),
      pipelined_chain_broadcast(),
      binomial_tree_broadcast(),
      ring_reduce(),
      binomial_tree_reduce(),
      ring_allgather(),
      recursive_doubling_allgather(),
      ring_reduce_scatter(),
      pairwise_alltoall(),
      dissemination_barrier(),
      direct_sendrecv(),
      shm_slots_allreduce(),
      shm_direct_allreduce(),
      hierarchical_allreduce(),
  };
  return table;
}

namespace {

size_t small_msg_bytes() {
  static const size_t value = [] {
    int64_t v = 65536;
    Status st = params::get_int("COMM_SMALL_MSG_BYTES", 0, INT64_MAX, &v);
    if (!st.ok()) {
      COMM_WARN(kAlg, "%s; using 65536", st.message().c_str());
      v = 65536;
    }
    return static_cast<size_t>(v);
  }();
  return value;
}

const Algorithm* find(CollKind kind, const char* name) {
  for (const auto& a : registry())
    if (a.kind == kind && std::strcmp(a.name, name) == 0) return &a;
  return nullptr;
}

// The registry entry named `name` for `kind`, looked up once per call site (the names are
// literals) rather than by string compares on every call.
#define ALGO(kind, name)                                               \
  ([]() -> const Algorithm* {                                          \
    static const Algorithm* const entry = find(CollKind::kind, name);  \
    return entry;                                                      \
  }())

// The algorithm the size rule picks for this call (it may still say "not me"), else nullptr.
const Algorithm* small_choice(const Context& ctx, const CollArgs& args) {
  const size_t bytes = args.count * dtype_size(args.dtype);
  switch (args.kind) {
    case CollKind::kAllreduce:
      if (transport::LocalAccess* la = ctx.transport.local()) {
        // One host: shared slots, then the direct algorithm; several: shm inside, rings between.
        if (static_cast<int>(la->local_ranks().size()) == ctx.size)
          return bytes <= la->slot_bytes() ? ALGO(kAllreduce, "shm_slots") : ALGO(kAllreduce, "shm_direct");
        if (bytes > small_msg_bytes()) return ALGO(kAllreduce, "hierarchical");
      }
      return bytes <= small_msg_bytes() ? ALGO(kAllreduce, "recursive_doubling") : ALGO(kAllreduce, "ring");
    case CollKind::kBroadcast:
      return bytes <= small_msg_bytes() ? ALGO(kBroadcast, "binomial_tree") : ALGO(kBroadcast, "pipelined_chain");
    case CollKind::kReduce:
      return bytes <= small_msg_bytes() ? ALGO(kReduce, "binomial_tree") : ALGO(kReduce, "ring");
    case CollKind::kAllgather:
      return bytes * static_cast<size_t>(ctx.size) <= small_msg_bytes() ? ALGO(kAllgather, "recursive_doubling")
                                                                         : ALGO(kAllgather, "ring");
    default:
      return nullptr;
  }
}

#undef ALGO

std::string known_names() {
  std::string text;
  CollKind last = CollKind::kInternal;
  for (const auto& a : registry()) {
    if (a.kind != last) {
      if (!text.empty()) text += "; ";
      text += std::string(transport::coll_name(a.kind)) + ": ";
      last = a.kind;
    } else {
      text += ", ";
    }
    text += a.name;
  }
  return text;
}

// A forced algorithm that cannot run is worth one warning per algorithm, not one per call.
bool first_fallback(const Algorithm* a) {
  static std::atomic<uint64_t> warned{0};
  const auto index = static_cast<unsigned>(a - registry().data());
  const uint64_t bit = index < 64 ? uint64_t{1} << index : 0;
  return (warned.fetch_or(bit, std::memory_order_relaxed) & bit) == 0;
}

// "COMM_ALGO=ring", or "tuning profile entry #3 (...): algo=ring" (log lines only).
std::string who(const char* source, const std::string& forced) {
  if (std::strcmp(source, "COMM_ALGO") == 0) return "COMM_ALGO=" + forced;
  return std::string(source) + ": algo=" + forced;
}

}  // namespace

Status select(const Context& ctx, const CollArgs& args, const std::string& forced, const Algorithm** out,
              const char* source) {
  *out = nullptr;
  const Algorithm* fallback_from = nullptr;
  if (!forced.empty()) {
    bool known = false;
    for (const auto& a : registry()) known = known || forced == a.name;
    if (!known) return InvalidArgument("COMM_ALGO='" + forced + "' names no algorithm; known: " + known_names());
    const Algorithm* a = find(args.kind, forced.c_str());
    if (a != nullptr && a->can_run(ctx, args)) {
      *out = a;
      return Status::Ok();
    }
    fallback_from = a;  // nullptr: the name belongs to other collectives, nothing to report
  }

  const Algorithm* chosen = nullptr;
  if (const Algorithm* a = small_choice(ctx, args)) {
    if (a->can_run(ctx, args)) chosen = a;
  }
  for (const auto& a : registry()) {
    if (chosen != nullptr) break;
    if (a.kind == args.kind && a.can_run(ctx, args)) chosen = &a;
  }
  if (chosen == nullptr)
    return InvalidArgument("no algorithm can run " + transport::describe(args.tag) + " on " + std::to_string(ctx.size) +
                           " ranks (peer " + std::to_string(args.peer) + ")");

  if (fallback_from != nullptr) {
    if (first_fallback(fallback_from)) {
      COMM_WARN(kAlg, "%s cannot run %s on %d ranks; using %s instead (warned once)", who(source, forced).c_str(),
                transport::describe(args.tag).c_str(), ctx.size, chosen->name);
    } else {
      COMM_INFO(kAlg, "%s cannot run %s on %d ranks; using %s instead", who(source, forced).c_str(),
                transport::describe(args.tag).c_str(), ctx.size, chosen->name);
    }
  }
  *out = chosen;
  return Status::Ok();
}

Status run_collective(Context& ctx, const CollArgs& args, const std::string& forced, const char* source) {
  const Algorithm* algo = nullptr;
  COMM_RETURN_IF_ERROR(select(ctx, args, forced, &algo, source));
  COMM_TRACE(kAlg, "%s: %s", transport::describe(args.tag).c_str(), algo->name);
  return algo->run(ctx, args);
}

}  // namespace comm::algo

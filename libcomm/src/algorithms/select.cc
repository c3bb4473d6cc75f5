// The one place that decides which algorithm runs a call. For each call it walks:
//   1. the forced name (COMM_ALGO),
//   2. the tuning profile entry's algo for this call's collective and size range,
//   3. the default rules below (a latency algorithm for small calls, a bandwidth one for large,
//      shared memory where every rank can reach it),
//   4. the first algorithm of the collective, in registry order, whose can_run says yes.
// A step whose algorithm says "not me" passes to the next; a forced name that could not run is
// reported once. The call path allocates nothing and builds no string unless it warns.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "algorithms/common.h"
#include "log.h"
#include "params.h"

namespace comm::algo {

namespace {

size_t small_msg_bytes() {
  static const size_t value = static_cast<size_t>(params::int_or_default("COMM_SMALL_MSG_BYTES", log::kAlg));
  return value;
}

const Algorithm* find(CollKind kind, std::string_view name) {
  for (const auto& a : registry())
    if (a.kind == kind && name == a.name) return &a;
  return nullptr;
}

// The default rules, as data. A collective with a latency and a bandwidth algorithm takes the
// first up to COMM_SMALL_MSG_BYTES and the second above; allgather counts every rank's block.
struct SizeRule {
  CollKind kind;
  bool all_blocks;
  const char* small;
  const char* large;
};
constexpr SizeRule kSizeRules[] = {
    {CollKind::kAllreduce, false, "recursive_doubling", "ring"},
    {CollKind::kBroadcast, false, "binomial_tree", "pipelined_chain"},
    {CollKind::kReduce, false, "binomial_tree", "ring"},
    {CollKind::kAllgather, true, "recursive_doubling", "ring"},
};
// All-reduce where the transport gives direct access (LocalAccess): with every rank on this
// host, shared slots up to a slot's size and the direct algorithm above; across hosts, the
// hierarchical algorithm above COMM_SMALL_MSG_BYTES (below it, the size rule's latency one).
constexpr const char* kOneHostSmall = "shm_slots";
constexpr const char* kOneHostLarge = "shm_direct";
constexpr const char* kAcrossHostsLarge = "hierarchical";

// The rules' names looked up in the registry once, so a call compares no strings.
struct Rules {
  struct BySize {
    const Algorithm* small = nullptr;
    const Algorithm* large = nullptr;
    bool all_blocks = false;
  };
  BySize by_size[static_cast<int>(CollKind::kInternal) + 1];
  const Algorithm* one_host_small;
  const Algorithm* one_host_large;
  const Algorithm* across_hosts_large;
};

const Rules& rules() {
  static const Rules r = [] {
    Rules out{};
    for (const SizeRule& rule : kSizeRules)
      out.by_size[static_cast<int>(rule.kind)] = {find(rule.kind, rule.small), find(rule.kind, rule.large),
                                                  rule.all_blocks};
    out.one_host_small = find(CollKind::kAllreduce, kOneHostSmall);
    out.one_host_large = find(CollKind::kAllreduce, kOneHostLarge);
    out.across_hosts_large = find(CollKind::kAllreduce, kAcrossHostsLarge);
    return out;
  }();
  return r;
}

// Step 3: the algorithm the default rules pick for this call (it may still say "not me"), or
// nullptr when no rule covers the collective.
const Algorithm* by_rule(const Context& ctx, const CollArgs& args) {
  const Rules& r = rules();
  const size_t bytes = args.count * dtype_size(args.dtype);
  if (args.kind == CollKind::kAllreduce) {
    if (transport::LocalAccess* la = ctx.transport.local()) {
      if (static_cast<int>(la->local_ranks().size()) == ctx.size)
        return bytes <= la->slot_bytes() ? r.one_host_small : r.one_host_large;
      if (bytes > small_msg_bytes()) return r.across_hosts_large;
    }
  }
  const Rules::BySize& rule = r.by_size[static_cast<int>(args.kind)];
  if (rule.small == nullptr) return nullptr;
  const size_t counted = rule.all_blocks ? bytes * static_cast<size_t>(ctx.size) : bytes;
  return counted <= small_msg_bytes() ? rule.small : rule.large;
}

// Step 4: the first algorithm of this collective, in registry order, that can run the call.
const Algorithm* first_runnable(const Context& ctx, const CollArgs& args) {
  for (const auto& a : registry())
    if (a.kind == args.kind && a.can_run(ctx, args)) return &a;
  return nullptr;
}

// Steps 3 and 4, what a call gets when no name is forced.
const Algorithm* by_default(const Context& ctx, const CollArgs& args) {
  if (const Algorithm* a = by_rule(ctx, args); a != nullptr && a->can_run(ctx, args)) return a;
  return first_runnable(ctx, args);
}

[[gnu::cold]] [[gnu::noinline]] Status none_can_run(const Context& ctx, const CollArgs& args) {
  return InvalidArgument("no algorithm can run " + transport::describe(args.tag) + " on " + std::to_string(ctx.size) +
                         " ranks (peer " + std::to_string(args.peer) + ")");
}

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

// Steps 1 and 2: the named algorithm when it can run this call. `*refused` is set when it
// belongs to this collective but cannot run; a name of another collective is no error.
Status named(const Context& ctx, const CollArgs& args, std::string_view name, const char* source,
             const Algorithm** out, const Algorithm** refused) {
  COMM_RETURN_IF_ERROR(check_name(name, source));
  const Algorithm* a = find(args.kind, name);
  if (a != nullptr && a->can_run(ctx, args)) {
    *out = a;
  } else if (*refused == nullptr) {
    *refused = a;
  }
  return Status::Ok();
}

// A forced algorithm that cannot run is worth one warning per algorithm, not one per call.
bool first_fallback(const Algorithm* a) {
  static std::atomic<uint64_t> warned{0};
  const auto index = static_cast<unsigned>(a - registry().data());
  const uint64_t bit = index < 64 ? uint64_t{1} << index : 0;
  return (warned.fetch_or(bit, std::memory_order_relaxed) & bit) == 0;
}

// "COMM_ALGO=ring", or "tuning profile entry #3 (...): algo=ring" (log lines only).
std::string who(const char* source, std::string_view name) {
  if (std::strcmp(source, "COMM_ALGO") == 0) return "COMM_ALGO=" + std::string(name);
  return std::string(source) + ": algo=" + std::string(name);
}

[[gnu::cold]] [[gnu::noinline]] void report_fallback(const Context& ctx, const CollArgs& args, const Algorithm* refused, const char* source,
                     std::string_view name, const Algorithm* chosen) {
  if (first_fallback(refused)) {
    COMM_WARN(kAlg, "%s cannot run %s on %d ranks; using %s instead (warned once)", who(source, name).c_str(),
              transport::describe(args.tag).c_str(), ctx.size, chosen->name);
  } else {
    COMM_INFO(kAlg, "%s cannot run %s on %d ranks; using %s instead", who(source, name).c_str(),
              transport::describe(args.tag).c_str(), ctx.size, chosen->name);
  }
}

// Steps 1 and 2, then 3 and 4 when neither named algorithm can run (kept out of the common
// path: a call with nothing forced never comes here).
[[gnu::noinline]] Status select_named(const Context& ctx, const CollArgs& args, const Overrides& overrides,
                                      const Algorithm** out) {
  const Algorithm* chosen = nullptr;
  const Algorithm* refused = nullptr;  // the first named algorithm that said "not me"
  const char* refused_source = nullptr;
  std::string_view refused_name;
  const struct {
    std::string_view name;
    const char* source;
  } steps[] = {{overrides.forced, "COMM_ALGO"}, {overrides.profile, overrides.profile_source}};
  for (const auto& step : steps) {
    if (step.name.empty()) continue;
    const Algorithm* before = refused;
    COMM_RETURN_IF_ERROR(named(ctx, args, step.name, step.source, &chosen, &refused));
    if (chosen != nullptr) break;
    if (refused != before) {
      refused_source = step.source;
      refused_name = step.name;
    }
  }
  if (chosen == nullptr) chosen = by_default(ctx, args);
  if (chosen == nullptr) return none_can_run(ctx, args);
  if (refused != nullptr) report_fallback(ctx, args, refused, refused_source, refused_name, chosen);
  *out = chosen;
  return Status::Ok();
}

}  // namespace

Status select(const Context& ctx, const CollArgs& args, const Overrides& overrides, const Algorithm** out) {
  *out = nullptr;
  if (!overrides.forced.empty() || !overrides.profile.empty()) return select_named(ctx, args, overrides, out);
  const Algorithm* chosen = by_default(ctx, args);
  if (chosen == nullptr) return none_can_run(ctx, args);
  *out = chosen;
  return Status::Ok();
}

Status run_collective(Context& ctx, const CollArgs& args, const Overrides& overrides, const char** chosen) {
  const Algorithm* algo = nullptr;
  COMM_RETURN_IF_ERROR(select(ctx, args, overrides, &algo));
  if (chosen != nullptr) *chosen = algo->name;
  COMM_TRACE(kAlg, "%s: %s", transport::describe(args.tag).c_str(), algo->name);
  return algo->run(ctx, args);
}

Status check_name(std::string_view name, const char* source) {
  for (const auto& a : registry())
    if (name == a.name) return Status::Ok();
  const std::string who = std::strcmp(source, "COMM_ALGO") == 0 ? "COMM_ALGO" : std::string(source) + ": algo";
  return InvalidArgument(who + "='" + std::string(name) + "' names no algorithm; known: " + known_names());
}

}  // namespace comm::algo

// Strict mode: one small all-gather of the call's signature after each collective. Without it
// a rank that only sends in a call (broadcast's root, reduce's leaves) may return before a peer
// finds the disagreement; with it every rank waits for every rank's word on what was called.
#include "strict.h"

#include <cstring>

#include "common/wire_tag.h"

namespace comm {

Status confirm_signature(comm_t c, algo::Context& ctx, const algo::CollArgs& args) {
  if (c->size < 2) return Status::Ok();
  const transport::WireTag mine = transport::wire_tag(args.tag);
  const size_t bytes = sizeof(transport::WireTag) * static_cast<size_t>(c->size);
  if (c->strict_signatures.size() < bytes) c->strict_signatures.resize(bytes);  // once per communicator
  algo::CollArgs check;
  check.kind = transport::CollKind::kAllgather;
  check.sendbuf = &mine;
  check.recvbuf = c->strict_signatures.data();
  check.count = sizeof(transport::WireTag);
  check.dtype = COMM_UINT8;
  check.op = COMM_SUM;
  // A number no call has (the top bit set): shared memory compares a stuck message's tag with
  // the peer's last one-sided call of the same number, and the call just checked may be one.
  // Ranks whose sequence numbers differ still fail at this tag.
  check.tag.seq = args.tag.seq | (uint64_t{1} << 63);
  check.tag.coll = transport::CollKind::kInternal;
  check.tag.order = args.tag.order;  // part of the call it checks
  check.tag.dtype = static_cast<uint8_t>(COMM_UINT8);
  check.tag.count = sizeof(transport::WireTag);
  const std::string what = "strict check (COMM_CHECK_COLLECTIVES=1) of " + transport::describe(args.tag) + ": ";
  Status st = algo::run_collective(ctx, check, algo::Overrides{});
  if (!st.ok()) return st.prefixed(what);
  for (int r = 0; r < c->size; ++r) {
    transport::WireTag theirs;
    std::memcpy(&theirs, c->strict_signatures.data() + sizeof(transport::WireTag) * static_cast<size_t>(r), sizeof theirs);
    if (std::memcmp(&theirs, &mine, sizeof mine) == 0) continue;
    return InvalidUsage(what + "rank " + std::to_string(c->rank) + " (this rank) called " +
                        transport::describe(args.tag) + " but rank " + std::to_string(r) + " called " +
                        transport::describe(transport::op_tag(theirs)) + "; every rank must call the same collectives in the same "
                        "order with the same count, dtype, op and root");
  }
  return Status::Ok();
}

}  // namespace comm

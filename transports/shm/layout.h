// What the shared-memory transport puts in shared memory: one control segment per rank and
// communicator (counters, the two call descriptors, the small-message slots, one channel per
// receiving peer), and one arena per rank and job (comm_mem_alloc buffers, staging). Every
// local rank maps every local segment; a rank writes only its own segment, except the
// consumer counters (`tail`) of the channels it receives on.
//
// Counters and flags live on their own cache lines (128 bytes apart: the adjacent-line
// prefetcher pairs lines), so a spinning reader never slows the writer of a neighbour.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/wire_tag.h"

namespace comm::transport::shm {

constexpr uint64_t kControlMagic = 0x4c52544e43434d31ull;  // "1MCCNTRL"
constexpr uint64_t kArenaMagic = 0x414e455241434d31ull;    // "1MCARENA"
// The owner's claim, written by Segment::create before anything else happens to a new
// segment, until its owner writes the real magic (last, once the header is complete): a rank
// killed in between leaves a segment remove_orphans can still attribute.
constexpr uint64_t kClaimMagic = 0x4d49414c43434d31ull;    // "1MCCLAIM"
// 2: ControlHeader.left; 3: ControlLines.beat; 4: ControlHeader.error_order
constexpr uint32_t kLayoutVersion = 4;
constexpr size_t kLine = 128;
constexpr size_t kPage = 4096;
constexpr size_t kMaxErrorText = 512;
constexpr int kChannelSlots = 4;

struct alignas(kLine) Counter {
  std::atomic<uint64_t> value{0};
};
struct alignas(kLine) Futex {
  std::atomic<uint32_t> word{0};
};
static_assert(sizeof(Counter) == kLine && sizeof(Futex) == kLine);
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free);

// OpTag as it sits in shared memory (fixed layout; read by peers and compared): transports/common/wire_tag.h.

// How a peer reaches a buffer this rank exposes for one call, or a message's payload.
enum class Reach : uint32_t {
  kNone = 0,
  kArena = 1,    // in the owner's arena, at `where` bytes from its start: read in place
  kCma = 2,      // at address `where` in the owner's process: process_vm_readv
  kStaged = 3,   // through the owner's staging ring, at `where` bytes into its arena
};

struct RegionDesc {
  uint32_t reach;  // Reach
  uint32_t pad;
  uint64_t where;
};

constexpr int kMarks = 4;  // LocalAccess::Mark

// One large call's buffers; two of them, the call number's parity picks one (a peer is at
// most one call ahead, so the other one is never rewritten while someone reads it).
struct alignas(kLine) CallDesc {
  WireTag tag;
  uint64_t bytes;
  uint64_t chunk_bytes;  // every rank must pipeline alike
  RegionDesc in, out;
  uint64_t mark_base[kMarks];  // the owner's mark counters when the call began
};

// The first bytes of every segment: whose it is. A segment whose owner died before unlinking
// it (killed during setup) is removed by the next job's init on this host (remove_orphans).
struct OwnerPrefix {
  uint64_t magic;
  uint32_t version;
  int32_t pid;
  uint64_t pid_ns;  // inode of the owner's pid namespace: pids mean nothing across namespaces
};
static_assert(sizeof(OwnerPrefix) == 24);

struct alignas(kPage) ControlHeader {
  uint64_t magic;
  uint32_t version;
  int32_t pid;
  uint64_t pid_ns;
  uint64_t self_address;  // where the owner maps this segment (the process_vm_readv probe)
  uint64_t segment_bytes;
  uint32_t comm_size;
  uint32_t local_size;
  uint32_t local_index;
  uint32_t slot_bytes;
  uint32_t fragment_bytes;
  uint32_t channel_slots;
  uint64_t probe_word;  // a known value the process_vm_readv probe reads
  // Set once by the owner when it fails (notify_peers): its comm_status_t and why, and the
  // operation it failed in (OpTag::order; 0: unknown), written before error_code.
  std::atomic<uint32_t> error_code;
  uint32_t error_len;
  uint64_t error_order;
  char error_text[kMaxErrorText];
  // Set by the owner's comm_destroy: its process may exit now without being taken for a death
  // by peers that idle (idle detection, ShmTransport::check_idle).
  std::atomic<uint32_t> left;
};

// Cache lines after the header, in this order.
struct alignas(kLine) ControlLines {
  Futex doorbell;      // peers bump it and FUTEX_WAKE it when `sleeping` is set
  Counter sleeping;    // the owner is (about to be) blocked in FUTEX_WAIT
  Counter posted;           // the number of the last one-sided call posted
  Counter marks[kMarks];    // steps done per LocalAccess::Mark (monotonic over the communicator's life)
  Counter finished;         // the number of the last one-sided call whose reads are over
  // Bumped by the owner's watcher every COMM_HEARTBEAT_MS, also while the owner is in a call
  // (ShmTransport::beat): a peer that idles takes a counter that stands still for the silence
  // limit (common/silence.h) for a stopped or hung process, which its pidfd cannot show.
  Counter beat;
  CallDesc desc[2];
};

// One message fragment (or, for zero-copy, the whole message's address) in a channel.
struct alignas(64) SlotHeader {
  WireTag tag;
  uint64_t total_bytes;  // the whole message
  uint64_t offset;       // this fragment's place in it
  uint64_t length;       // inline payload bytes that follow the header
  uint32_t reach;        // Reach::kNone: inline; kArena / kCma: read the whole message from `where`
  uint32_t pad;
  uint64_t where;
};
static_assert(sizeof(SlotHeader) == 64);

// A single-producer single-consumer ring from the segment's owner to one local peer.
struct alignas(kLine) ChannelHead {
  Counter head;  // slots filled (owner)
  Counter tail;  // slots consumed (the receiving peer)
};

struct alignas(kPage) ArenaHeader {
  uint64_t magic;
  uint32_t version;
  int32_t pid;
  uint64_t pid_ns;
  uint64_t self_address;
  uint64_t bytes;
  uint64_t probe_word;
};
static_assert(offsetof(ControlHeader, pid_ns) == offsetof(OwnerPrefix, pid_ns) &&
              offsetof(ArenaHeader, pid_ns) == offsetof(OwnerPrefix, pid_ns));

// The head of a small-message slot: the call number, written last, shares its cache line
// with the tag and the first 32 bytes of data, so a reader waiting on it pulls all three in
// one transfer (NCCL's LL protocol does the same with its flags).
struct SlotHead {
  std::atomic<uint64_t> call;
  WireTag tag;
};
static_assert(sizeof(SlotHead) == 32);

// Byte offsets of each part of a control segment for a given geometry.
struct ControlGeometry {
  size_t local_size = 1;
  size_t slot_bytes = 0;      // one small-message slot (two per rank: call parity)
  size_t fragment_bytes = 0;  // inline payload per channel slot

  static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
  size_t lines_offset() const { return sizeof(ControlHeader); }
  size_t slots_offset() const { return round_up(lines_offset() + sizeof(ControlLines), kPage); }
  size_t slot_stride() const { return round_up(sizeof(SlotHead) + slot_bytes, kPage); }
  size_t channel_stride() const {
    return round_up(sizeof(ChannelHead) + kChannelSlots * slot_record(), kPage);
  }
  size_t slot_record() const { return sizeof(SlotHeader) + round_up(fragment_bytes, 64); }
  size_t channels_offset() const { return slots_offset() + 2 * slot_stride(); }
  size_t total() const { return channels_offset() + local_size * channel_stride(); }
};

}  // namespace comm::transport::shm

// An OpTag as fixed-width fields: the same 24 bytes on every rank of a job (one build, one byte
// order). Shared memory keeps it in its slots and headers (transports/shm/layout.h), and strict
// mode all-gathers it as a call's signature (libcomm/src/strict.cc).
#pragma once

#include <cstdint>

#include "transport.h"

namespace comm::transport {

struct WireTag {
  uint64_t seq;
  uint64_t count;
  int32_t root;
  uint8_t coll;
  uint8_t dtype;
  uint8_t op;
  uint8_t pad;
};
static_assert(sizeof(WireTag) == 24);

inline WireTag wire_tag(const OpTag& t) {
  WireTag w{};
  w.seq = t.seq;
  w.count = t.count;
  w.root = t.root;
  w.coll = static_cast<uint8_t>(t.coll);
  w.dtype = t.dtype;
  w.op = t.op;
  return w;
}

inline OpTag op_tag(const WireTag& w) {
  OpTag t;
  t.seq = w.seq;
  t.count = w.count;
  t.root = w.root;
  t.coll = static_cast<CollKind>(w.coll);
  t.dtype = w.dtype;
  t.op = w.op;
  return t;
}

}  // namespace comm::transport

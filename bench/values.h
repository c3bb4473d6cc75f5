// Inputs that are a function of (seed, rank, index) and exact in every dtype, so that each
// rank knows its expected output without a reference run and the check compares bitwise.
#pragma once

#include <comm/comm.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace bench {

enum class Kind { kSigned, kUnsigned, kFloat, kDouble, kHalf, kBfloat16 };

struct DtypeInfo {
  const char* name;  // as nccl-tests prints it
  const char* alias;
  comm_dtype_t dtype;
  size_t bytes;
  Kind kind;
  double exact_limit;  // largest integer up to which every integer is representable (0: integer type)
};

const DtypeInfo* find_dtype(const char* name);  // nullptr when unknown
const DtypeInfo& dtype_info(comm_dtype_t dtype);
const std::vector<DtypeInfo>& all_dtypes();

const char* op_name(comm_op_t op);
bool find_op(const char* name, comm_op_t* out);

// Inputs repeat every kPeriod elements; a "period" is kPeriod elements of one dtype, and a
// buffer is filled with a period rotated to the buffer's starting index.
constexpr size_t kPeriod = 17;
using Period = std::vector<unsigned char>;

// The largest input value that keeps every partial result exact on `nranks` ranks.
uint64_t value_bound(const DtypeInfo& d, comm_op_t op, int nranks);

// Rank `rank`'s input at element index `index` (of its own send buffer), as a period.
Period input_period(const DtypeInfo& d, uint64_t seed, int rank, uint64_t bound);
// The reduction over all ranks of their inputs, as libcomm defines each op (docs/design/rules.md, "What each op computes").
Period reduced_period(const DtypeInfo& d, comm_op_t op, uint64_t seed, int nranks, uint64_t bound);
// `p` rotated so that element 0 is element `start` of the infinite periodic sequence.
Period rotate(const Period& p, size_t elem, size_t start);

// Fills `count` elements with the periodic sequence starting at index `start`.
void fill(unsigned char* dst, size_t count, size_t elem, const Period& p, size_t start);
// Elements among `count` at `got` that differ (bitwise) from the sequence starting at `start`.
int64_t count_wrong(const unsigned char* got, size_t count, size_t elem, const Period& p, size_t start);

}  // namespace bench

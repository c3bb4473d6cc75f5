// The reference the ABI tests check libcomm against, written from the contract alone (no
// library internals): inputs as a function of (seed, rank, index), as nccl-tests does, so
// every rank knows every other rank's input; expected reductions computed element by element
// in float64 (floats) or in exact wrapping integer arithmetic (integers).
// Shared by the Catch2 tests and rank_worker, so it knows nothing of Catch2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/comm.h"

namespace abi {

inline constexpr comm_dtype_t kAllDtypes[] = {COMM_FLOAT32, COMM_FLOAT64, COMM_FLOAT16, COMM_BFLOAT16,
                                              COMM_INT8,    COMM_UINT8,   COMM_INT32,   COMM_UINT32,
                                              COMM_INT64,   COMM_UINT64};
inline constexpr comm_op_t kAllOps[] = {COMM_SUM, COMM_PROD, COMM_MIN, COMM_MAX, COMM_AVG};
// The sweep's largest count: 2^20 + 3, a multiple of no rank count.
inline constexpr size_t kLargeCount = 1048579;

size_t dtype_size(comm_dtype_t dtype);
const char* dtype_name(comm_dtype_t dtype);
const char* op_name(comm_op_t op);
bool is_float(comm_dtype_t dtype);

// IEEE binary16 and bfloat16, round to nearest even: the test's own, not libcomm's.
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);

// Input element `index` of `rank`, shaped for `op` (prod gets magnitudes near 1 for floats so
// five ranks neither overflow fp16 nor underflow; integers get the full range so sums and
// products wrap). Non-reducing collectives use COMM_SUM's shape.
void write_input(void* dst, comm_dtype_t dtype, comm_op_t op, uint64_t seed, int rank, size_t index);
// buf[i] = input(rank, first_index + i) for i < count.
void fill_input(void* buf, size_t count, comm_dtype_t dtype, comm_op_t op, uint64_t seed, int rank,
                size_t first_index);

struct CheckResult {
  size_t wrong = 0;
  std::string first;  // the first wrong element, described; "" when none
  bool ok() const { return wrong == 0; }
};

// buf[i] must be the reduction over ranks 0..nranks-1 of input(r, first_index + i):
// integers exactly (wrapping; avg = wrapped sum / nranks truncated toward zero); floats
// within nranks * epsilon(type) * sum|x| (sum, avg) or nranks * epsilon * |product| (prod) of
// the float64 reference; min/max exactly.
CheckResult check_reduced(const void* buf, size_t count, comm_dtype_t dtype, comm_op_t op,
                          uint64_t seed, int nranks, size_t first_index);
// buf[i] must be bitwise input(rank, first_index + i) (data that is moved, not reduced).
CheckResult check_copied(const void* buf, size_t count, comm_dtype_t dtype, comm_op_t op,
                         uint64_t seed, int rank, size_t first_index);
// Where two buffers first differ, as "element I: XX.. vs YY..", or "" when identical.
std::string first_difference(const void* a, const void* b, size_t count, comm_dtype_t dtype);

uint64_t mix64(uint64_t x);  // splitmix64 finaliser
uint64_t fnv1a(const void* data, size_t bytes);

}  // namespace abi

// Element types and reduction kernels: one table, type-erased (Gloo's lesson).
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/comm.h"
#include "types.h"

namespace comm {

// out[i] = a[i] (op) b[i] for i < count. out may alias a or b. For COMM_AVG this is the
// sum (the division happens once, at the end, in avg_finalize). fp16/bf16: computed in
// fp32 and rounded to nearest-even once per step. Integer sum/prod wrap (two's complement).
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t count);
ReduceFn reduce_fn(comm_dtype_t dtype, comm_op_t op);

// buf[i] = buf[i] / nranks: float types in their own precision (fp16/bf16 in fp32, rounded
// once), integers as the wrapped sum truncated toward zero.
void avg_finalize(void* buf, size_t count, comm_dtype_t dtype, int nranks);

// IEEE half and bfloat16 conversions (round to nearest even, NaN kept NaN).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);

}  // namespace comm

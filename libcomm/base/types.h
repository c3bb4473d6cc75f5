// The ABI's element types and reduction ops as plain data: what is valid, how large, what it
// is called. Every floor names types in messages; only the core reduces them (dtype.h).
#pragma once

#include <cstddef>

#include "comm/comm.h"

namespace comm {

bool dtype_valid(int dtype);
bool op_valid(int op);
size_t dtype_size(comm_dtype_t dtype);
const char* dtype_name(comm_dtype_t dtype);  // "float32", "bfloat16", ...
const char* op_name(comm_op_t op);           // "sum", "prod", "min", "max", "avg"

}  // namespace comm

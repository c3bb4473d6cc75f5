// The ABI's element types and ops as data: validity, sizes, names (for messages and logs).
#include "types.h"

namespace comm {

bool dtype_valid(int dtype) { return dtype >= 0 && dtype < COMM_NUM_DTYPES; }
bool op_valid(int op) { return op >= 0 && op < COMM_NUM_OPS; }

size_t dtype_size(comm_dtype_t dtype) {
  switch (dtype) {
    case COMM_FLOAT32: return 4;
    case COMM_FLOAT64: return 8;
    case COMM_FLOAT16: return 2;
    case COMM_BFLOAT16: return 2;
    case COMM_INT8: return 1;
    case COMM_UINT8: return 1;
    case COMM_INT32: return 4;
    case COMM_UINT32: return 4;
    case COMM_INT64: return 8;
    case COMM_UINT64: return 8;
  }
  return 0;
}

const char* dtype_name(comm_dtype_t dtype) {
  switch (dtype) {
    case COMM_FLOAT32: return "float32";
    case COMM_FLOAT64: return "float64";
    case COMM_FLOAT16: return "float16";
    case COMM_BFLOAT16: return "bfloat16";
    case COMM_INT8: return "int8";
    case COMM_UINT8: return "uint8";
    case COMM_INT32: return "int32";
    case COMM_UINT32: return "uint32";
    case COMM_INT64: return "int64";
    case COMM_UINT64: return "uint64";
  }
  return "unknown";
}

const char* op_name(comm_op_t op) {
  switch (op) {
    case COMM_SUM: return "sum";
    case COMM_PROD: return "prod";
    case COMM_MIN: return "min";
    case COMM_MAX: return "max";
    case COMM_AVG: return "avg";
  }
  return "unknown";
}

}  // namespace comm

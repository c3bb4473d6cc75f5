// comm_engine_config_t -> Options: API field > environment > default, validated at the edge.
#include <cstring>

#include "dtype.h"
#include "engine/engine.h"
#include "params.h"

namespace comm::engine {

namespace {
Status flag(const char* name, int v, bool* out) {
  if (v == COMM_UNSET) return Status::Ok();
  if (v != 0 && v != 1)
    return InvalidArgument(std::string("comm_engine_create: ") + name + " = " + std::to_string(v) +
                           " must be 0, 1 or COMM_UNSET");
  *out = v == 1;
  return Status::Ok();
}
}  // namespace

Status resolve_options(const comm_engine_config_t* in, Options* out) {
  comm_engine_config_t cfg = COMM_ENGINE_CONFIG_INIT;
  if (in != nullptr) {
    // An older caller passes a smaller struct: what it lacks keeps its unset value.
    const size_t base = offsetof(comm_engine_config_t, version) + sizeof(int);
    if (in->size < base || in->version < 1)
      return InvalidArgument("comm_engine_create: comm_engine_config_t not initialised (size " +
                             std::to_string(in->size) + ", version " + std::to_string(in->version) +
                             "); start from COMM_ENGINE_CONFIG_INIT");
    std::memcpy(&cfg, in, in->size < sizeof cfg ? in->size : sizeof cfg);
    cfg.size = sizeof cfg;
  }
  Options o;
  o.stream = cfg.stream;
  int64_t v = 0;
  if (cfg.bucket_cap_bytes == COMM_UNSET) {
    COMM_RETURN_IF_ERROR(params::get_int("COMM_ENGINE_BUCKET_CAP_BYTES", &v));
    o.bucket_cap_bytes = static_cast<size_t>(v);
    if (auto env = params::env("COMM_ENGINE_BUCKET_CAP_BYTES")) o.bucket_cap_from = "COMM_ENGINE_BUCKET_CAP_BYTES=" + *env;
  } else if (cfg.bucket_cap_bytes <= 0) {
    return InvalidArgument("comm_engine_create: bucket_cap_bytes = " + std::to_string(cfg.bucket_cap_bytes) +
                           " must be > 0 (or COMM_UNSET for 25 MiB)");
  } else {
    o.bucket_cap_bytes = static_cast<size_t>(cfg.bucket_cap_bytes);
    o.bucket_cap_from = "comm_engine_config_t.bucket_cap_bytes=" + std::to_string(cfg.bucket_cap_bytes);
  }
  if (cfg.first_bucket_bytes == COMM_UNSET) {
    COMM_RETURN_IF_ERROR(params::get_int("COMM_ENGINE_FIRST_BUCKET_BYTES", &v));
    o.first_bucket_bytes = static_cast<size_t>(v);
    if (auto env = params::env("COMM_ENGINE_FIRST_BUCKET_BYTES"))
      o.first_bucket_from = "COMM_ENGINE_FIRST_BUCKET_BYTES=" + *env;
  } else if (cfg.first_bucket_bytes <= 0) {
    return InvalidArgument("comm_engine_create: first_bucket_bytes = " + std::to_string(cfg.first_bucket_bytes) +
                           " must be > 0 (or COMM_UNSET for 1 MiB)");
  } else {
    o.first_bucket_bytes = static_cast<size_t>(cfg.first_bucket_bytes);
    o.first_bucket_from = "comm_engine_config_t.first_bucket_bytes=" + std::to_string(cfg.first_bucket_bytes);
  }
  if (cfg.op != COMM_UNSET) {
    if (!op_valid(cfg.op))
      return InvalidArgument("comm_engine_create: op " + std::to_string(cfg.op) + " is not a comm_op_t");
    o.op = static_cast<comm_op_t>(cfg.op);
  }
  if (cfg.wire_dtype != COMM_UNSET && cfg.wire_dtype != COMM_FLOAT32 && cfg.wire_dtype != COMM_FLOAT16 &&
      cfg.wire_dtype != COMM_BFLOAT16)
    return InvalidArgument("comm_engine_create: wire_dtype " + std::to_string(cfg.wire_dtype) +
                           " must be COMM_FLOAT16, COMM_BFLOAT16, COMM_FLOAT32 or COMM_UNSET (no compression)");
  o.wire_dtype = cfg.wire_dtype == COMM_FLOAT32 ? COMM_UNSET : cfg.wire_dtype;
  // Compression converts float32 to float16/bfloat16 and back in the bucket: on the device that
  // needs a kernel, and libcomm ships none (it opens CUDA with dlopen and builds without nvcc).
  if (o.stream != nullptr && o.wire_dtype != COMM_UNSET)
    return Unavailable("comm_engine_create: wire_dtype " + std::string(dtype_name(static_cast<comm_dtype_t>(o.wire_dtype))) +
                       " (compression) with device gradients (stream != NULL): converting on the device needs a CUDA "
                       "kernel, which libcomm does not have; leave wire_dtype unset, or cast the gradients to that "
                       "dtype in the framework (as DDP's fp16_compress_hook does) and register them as such");
  if (cfg.partition_bytes == COMM_UNSET) {
    COMM_RETURN_IF_ERROR(params::get_int("COMM_ENGINE_PARTITION_BYTES", &v));
    o.partition_bytes = static_cast<size_t>(v);
  } else if (cfg.partition_bytes <= 0) {
    return InvalidArgument("comm_engine_create: partition_bytes = " + std::to_string(cfg.partition_bytes) +
                           " must be > 0 (or COMM_UNSET for 4 MiB)");
  } else {
    o.partition_bytes = static_cast<size_t>(cfg.partition_bytes);
  }
  if (cfg.overlap_forward == COMM_UNSET) {
    COMM_RETURN_IF_ERROR(params::get_int("COMM_ENGINE_OVERLAP_FORWARD", &v));
    o.overlap_forward = v == 1;
  } else {
    COMM_RETURN_IF_ERROR(flag("overlap_forward", cfg.overlap_forward, &o.overlap_forward));
  }
  if (o.overlap_forward && o.stream != nullptr)
    return Unavailable("comm_engine_create: overlap_forward with device gradients (stream != NULL): end() already "
                       "returns before the device all-reduces finish (the gradients' stream waits for them); leave "
                       "overlap_forward unset");
  std::string schedule;
  COMM_RETURN_IF_ERROR(params::get_string("COMM_ENGINE_SCHEDULE", &schedule));
  if (schedule == "fifo") {
    o.fifo = true;
  } else if (schedule != "priority" && !schedule.empty()) {
    return InvalidArgument("comm_engine_create: COMM_ENGINE_SCHEDULE=" + schedule + " must be priority or fifo");
  }
  // Device gradients: each bucket's copies and all-reduce are one sequence on the engine's
  // stream (libcomm/src/engine/step.cc, run_bucket_device): one partition per bucket, in order.
  if (o.stream != nullptr) {
    o.fifo = true;
    o.partition_bytes = SIZE_MAX;
  }
  COMM_RETURN_IF_ERROR(flag("gradient_as_bucket_view", cfg.gradient_as_bucket_view, &o.grad_view));
  COMM_RETURN_IF_ERROR(flag("static_graph", cfg.static_graph, &o.static_graph));
  COMM_RETURN_IF_ERROR(flag("find_unused_parameters", cfg.find_unused_parameters, &o.find_unused));
  if (cfg.trace_file != nullptr) {
    o.trace_file = cfg.trace_file;
  } else {
    COMM_RETURN_IF_ERROR(params::get_string("COMM_TRACE_FILE", &o.trace_file));
  }
  *out = std::move(o);
  return Status::Ok();
}

}  // namespace comm::engine

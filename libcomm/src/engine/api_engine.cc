// C ABI of the gradient engine (stubs: the engine is being built).
#include "abi_guard.h"

using comm::Status;

extern "C" {

#define COMM_ENGINE_STUB(name) \
  comm::guarded(#name, []() -> Status { return comm::Internal(#name ": the gradient engine is not built yet"); })

COMM_API comm_status_t comm_engine_create(comm_t, const comm_engine_config_t*, comm_engine_t*) { return COMM_ENGINE_STUB(comm_engine_create); }
COMM_API comm_status_t comm_engine_register(comm_engine_t, size_t, comm_dtype_t, int*) { return COMM_ENGINE_STUB(comm_engine_register); }
COMM_API comm_status_t comm_engine_finalize(comm_engine_t) { return COMM_ENGINE_STUB(comm_engine_finalize); }
COMM_API comm_status_t comm_engine_begin(comm_engine_t, int) { return COMM_ENGINE_STUB(comm_engine_begin); }
COMM_API comm_status_t comm_engine_grad_ready(comm_engine_t, int, void*) { return COMM_ENGINE_STUB(comm_engine_grad_ready); }
COMM_API comm_status_t comm_engine_grad_view(comm_engine_t, int, void**) { return COMM_ENGINE_STUB(comm_engine_grad_view); }
COMM_API comm_status_t comm_engine_end(comm_engine_t) { return COMM_ENGINE_STUB(comm_engine_end); }
COMM_API comm_status_t comm_engine_stats(comm_engine_t, comm_engine_stats_t*) { return COMM_ENGINE_STUB(comm_engine_stats); }
COMM_API comm_status_t comm_engine_unused(comm_engine_t, int*, int, int*) { return COMM_ENGINE_STUB(comm_engine_unused); }
COMM_API comm_status_t comm_engine_destroy(comm_engine_t) { return COMM_ENGINE_STUB(comm_engine_destroy); }

}  // extern "C"

// C ABI of the gradient engine: argument checks at the edge, then the Engine.
#include "abi_guard.h"
#include "engine/engine.h"
#include "engine_view.h"

using comm::Status;
using comm::engine::Engine;

namespace {
Status null_engine(const char* fn) { return comm::InvalidArgument(std::string(fn) + ": NULL engine"); }
}  // namespace

extern "C" {

COMM_API comm_status_t comm_engine_create(comm_t comm, const comm_engine_config_t* cfg, comm_engine_t* eng) {
  return comm::guarded("comm_engine_create", [&]() -> Status {
    if (comm == nullptr || eng == nullptr)
      return comm::InvalidArgument("comm_engine_create: NULL communicator or output pointer");
    *eng = nullptr;
    comm::engine::Options opt;
    COMM_RETURN_IF_ERROR(comm::engine::resolve_options(cfg, &opt).prefixed("rank " + std::to_string(comm::rank_of(comm)) + ", "));
    std::unique_ptr<Engine> impl;
    COMM_RETURN_IF_ERROR(Engine::create(comm, opt, &impl).prefixed_at(comm::rank_of(comm), "comm_engine_create"));
    *eng = new comm_engine_s{std::move(impl)};
    return Status::Ok();
  });
}

COMM_API comm_status_t comm_engine_register(comm_engine_t eng, size_t count, comm_dtype_t dtype, int* index) {
  return comm::guarded("comm_engine_register", [&]() -> Status {
    if (eng == nullptr || index == nullptr) return comm::InvalidArgument("comm_engine_register: NULL engine or index pointer");
    return eng->impl->add_param(count, dtype, index);
  });
}

COMM_API comm_status_t comm_engine_set_priority(comm_engine_t eng, int index, int priority) {
  return comm::guarded("comm_engine_set_priority", [&]() -> Status {
    if (eng == nullptr) return null_engine("comm_engine_set_priority");
    return eng->impl->set_priority(index, priority);
  });
}

COMM_API comm_status_t comm_engine_set_reduce_hook(comm_engine_t eng, comm_engine_reduce_hook_t fn, void* user) {
  return comm::guarded("comm_engine_set_reduce_hook", [&]() -> Status {
    if (eng == nullptr) return null_engine("comm_engine_set_reduce_hook");
    return eng->impl->set_reduce_hook(fn, user);
  });
}

COMM_API comm_status_t comm_engine_wait(comm_engine_t eng, int index) {
  return comm::guarded("comm_engine_wait", [&]() -> Status {
    if (eng == nullptr) return null_engine("comm_engine_wait");
    return eng->impl->wait(index);
  });
}

COMM_API comm_status_t comm_engine_test(comm_engine_t eng, int index, int* done) {
  return comm::guarded("comm_engine_test", [&]() -> Status {
    if (eng == nullptr) return null_engine("comm_engine_test");
    return eng->impl->test(index, done);
  });
}

COMM_API comm_status_t comm_engine_finalize(comm_engine_t eng) {
  return comm::guarded("comm_engine_finalize", [&]() -> Status {
    if (eng == nullptr) return null_engine("comm_engine_finalize");
    return eng->impl->finalize();
  });
}

COMM_API comm_status_t comm_engine_begin(comm_engine_t eng, int sync) {
  return comm::guarded("comm_engine_begin", [&]() -> Status {
    if (eng == nullptr) return null_engine("comm_engine_begin");
    return eng->impl->begin(sync != 0);
  });
}

COMM_API comm_status_t comm_engine_grad_ready(comm_engine_t eng, int index, void* ptr) {
  return comm::guarded("comm_engine_grad_ready", [&]() -> Status {
    if (eng == nullptr) return null_engine("comm_engine_grad_ready");
    return eng->impl->grad_ready(index, ptr);
  });
}

COMM_API comm_status_t comm_engine_grad_view(comm_engine_t eng, int index, void** ptr) {
  return comm::guarded("comm_engine_grad_view", [&]() -> Status {
    if (eng == nullptr || ptr == nullptr) return comm::InvalidArgument("comm_engine_grad_view: NULL engine or output pointer");
    return eng->impl->grad_view(index, ptr);
  });
}

COMM_API comm_status_t comm_engine_end(comm_engine_t eng) {
  return comm::guarded("comm_engine_end", [&]() -> Status {
    if (eng == nullptr) return null_engine("comm_engine_end");
    return eng->impl->end();
  });
}

COMM_API comm_status_t comm_engine_stats(comm_engine_t eng, comm_engine_stats_t* stats) {
  return comm::guarded("comm_engine_stats", [&]() -> Status {
    if (eng == nullptr || stats == nullptr) return comm::InvalidArgument("comm_engine_stats: NULL engine or stats pointer");
    if (stats->size < offsetof(comm_engine_stats_t, version) + sizeof(int))
      return comm::InvalidArgument("comm_engine_stats: stats->size is " + std::to_string(stats->size) +
                                   "; set it to sizeof(comm_engine_stats_t)");
    eng->impl->stats(stats);
    return Status::Ok();
  });
}

COMM_API comm_status_t comm_engine_unused(comm_engine_t eng, int* indices, int capacity, int* count) {
  return comm::guarded("comm_engine_unused", [&]() -> Status {
    if (eng == nullptr || count == nullptr || capacity < 0 || (indices == nullptr && capacity > 0))
      return comm::InvalidArgument("comm_engine_unused: NULL engine or count, or a NULL/negative-sized index array");
    return eng->impl->unused(indices, capacity, count);
  });
}

COMM_API comm_status_t comm_engine_destroy(comm_engine_t eng) {
  return comm::guarded("comm_engine_destroy", [&]() -> Status {
    if (eng == nullptr) return null_engine("comm_engine_destroy");
    Status st = eng->impl->destroy();
    delete eng;
    return st;
  });
}

}  // extern "C"

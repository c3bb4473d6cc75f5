// comm_engine_set_reduce_hook: the hook replaces each partition's all-reduce (called once per
// partition per synced step, in the same sequence on every rank, with the partition's buffer and
// parameters), its result reaches the gradients, a failing hook fails the step on its rank, and
// setting it after finalize or with device gradients is refused. Ranks are threads.
#include <algorithm>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "abi/harness.h"

namespace {

struct HookState {
  comm_t comm = nullptr;  // the hook's own communicator (a dup)
  std::vector<int> order; // partitions, in call order
  std::vector<int> params_seen;
  comm_status_t fail_with = COMM_OK;
};

// Sums over the ranks on the hook's communicator, then adds 1000: a result the built-in
// all-reduce (avg) cannot give.
comm_status_t sum_plus_1000(const comm_engine_hook_args_t* a, void* user) {
  auto* s = static_cast<HookState*>(user);
  s->order.push_back(a->partition);
  for (int i = 0; i < a->num_params; ++i) s->params_seen.push_back(a->params[i]);
  if (s->fail_with != COMM_OK) return s->fail_with;
  if (a->dtype != COMM_FLOAT32 || a->num_partitions < 1) return COMM_ERR_INTERNAL;
  comm_status_t st = comm_allreduce(s->comm, a->buffer, a->buffer, a->count, a->dtype, COMM_SUM, nullptr);
  auto* f = static_cast<float*>(a->buffer);
  for (size_t i = 0; i < a->count; ++i) f[i] += 1000.0f;
  return st;
}

}  // namespace

TEST_CASE("engine reduce hook: replaces each partition's all-reduce, in the same sequence on every rank", "[engine]") {
  abi::Ranks w = abi::init_ranks(2, "engine-hook", 20000);
  REQUIRE(w.all_ok());
  std::vector<HookState> states(2);
  std::vector<std::vector<float>> out(2);
  std::vector<int> partitions(2);
  std::vector<comm_status_t> failed(2), late(2);
  std::vector<std::string> fail_msg(2);
  abi::on_ranks(2, [&](int r) {
    HookState& s = states[static_cast<size_t>(r)];
    comm_t c = w.comms[static_cast<size_t>(r)];
    if (comm_dup(c, &s.comm) != COMM_OK) return;
    comm_engine_config_t cfg = COMM_ENGINE_CONFIG_INIT;
    cfg.bucket_cap_bytes = 256;
    cfg.first_bucket_bytes = 256;
    cfg.partition_bytes = 64;  // 16 floats: the 40-float gradient is split across partitions
    comm_engine_t e = nullptr;
    if (comm_engine_create(c, &cfg, &e) != COMM_OK) return;
    int idx;
    const size_t counts[] = {8, 40, 8};
    for (size_t n : counts) (void)comm_engine_register(e, n, COMM_FLOAT32, &idx);
    if (comm_engine_set_reduce_hook(e, sum_plus_1000, &s) != COMM_OK) return;
    if (comm_engine_finalize(e) != COMM_OK) return;
    late[static_cast<size_t>(r)] = comm_engine_set_reduce_hook(e, nullptr, nullptr);
    std::vector<std::vector<float>> g = {std::vector<float>(8, 1.0f + static_cast<float>(r)),
                                         std::vector<float>(40, 2.0f), std::vector<float>(8, 3.0f)};
    (void)comm_engine_begin(e, 1);
    for (int p = 2; p >= 0; --p) (void)comm_engine_grad_ready(e, p, g[static_cast<size_t>(p)].data());
    if (comm_engine_end(e) != COMM_OK) return;
    comm_engine_stats_t st{};
    st.size = sizeof st;
    (void)comm_engine_stats(e, &st);
    partitions[static_cast<size_t>(r)] = st.num_partitions;
    for (auto& v : g) out[static_cast<size_t>(r)].insert(out[static_cast<size_t>(r)].end(), v.begin(), v.end());
    // A hook that fails: the step fails on this rank with the hook named (both ranks fail, so
    // neither waits on the other).
    s.fail_with = COMM_ERR_INVALID_ARGUMENT;
    (void)comm_engine_begin(e, 1);
    for (int p = 2; p >= 0; --p) (void)comm_engine_grad_ready(e, p, g[static_cast<size_t>(p)].data());
    failed[static_cast<size_t>(r)] = comm_engine_end(e);
    fail_msg[static_cast<size_t>(r)] = comm_last_error(nullptr);
    (void)comm_engine_destroy(e);
    (void)comm_destroy(s.comm);
  });
  abi::destroy_ranks(w.comms);
  for (int r = 0; r < 2; ++r) {
    const auto& s = states[static_cast<size_t>(r)];
    INFO("rank " << r << ": " << fail_msg[static_cast<size_t>(r)]);
    REQUIRE(partitions[static_cast<size_t>(r)] >= 4);
    // First step: each partition once; the failing step stops at its first partition.
    REQUIRE(s.order.size() == static_cast<size_t>(partitions[static_cast<size_t>(r)]) + 1);
    CHECK(s.order == states[0].order);
    std::vector<int> sorted(s.order.begin(), s.order.end() - 1);
    std::sort(sorted.begin(), sorted.end());
    for (size_t k = 0; k < sorted.size(); ++k) CHECK(sorted[k] == static_cast<int>(k));
    for (int p = 0; p < 3; ++p)
      CHECK(std::find(s.params_seen.begin(), s.params_seen.end(), p) != s.params_seen.end());
    // The hook's sum + 1000 reached every gradient: (1 + 2) + 1000, 2 + 2 + 1000, 3 + 3 + 1000.
    const auto& o = out[static_cast<size_t>(r)];
    REQUIRE(o.size() == 56);
    for (size_t i = 0; i < 8; ++i) CHECK(o[i] == 1003.0f);
    for (size_t i = 8; i < 48; ++i) CHECK(o[i] == 1004.0f);
    for (size_t i = 48; i < 56; ++i) CHECK(o[i] == 1006.0f);
    CHECK(late[static_cast<size_t>(r)] == COMM_ERR_INVALID_USAGE);
    CHECK(failed[static_cast<size_t>(r)] != COMM_OK);
    CHECK(abi::icontains(fail_msg[static_cast<size_t>(r)], "reduce hook returned"));
  }
}

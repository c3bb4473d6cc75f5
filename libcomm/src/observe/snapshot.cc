// The snapshot the metrics plugin turns into Prometheus families at each scrape (metrics.h):
// every live communicator's counters (stats.h), straggler detection's per-peer waits
// (transports/common/arrivals.h) and where the flight recorder says it is now. Counts only:
// never a key, a token, a store value or a byte of data. JSON, so the plugin may be built apart.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/arrivals.h"
#include "observe/live.h"
#include "observe/metrics.h"
#include "version.h"

namespace comm::observe {
namespace {

// Peers listed per communicator: the ones a message came from, at most this many (the most
// waited on first), so a 4096-rank job's scrape stays small (bounded cardinality).
constexpr size_t kMaxPeers = 32;

const char* status_label(size_t code) {
  static const char* names[kStatusCodes] = {"ok",      "invalid_argument", "invalid_usage", "system",  "timeout",
                                            "remote",  "aborted",          "unavailable",   "internal"};
  return code < kStatusCodes ? names[code] : "unknown";
}

nlohmann::json describe(comm_t c, uint64_t now_ns) {
  nlohmann::json j;
  j["comm"] = c->id;
  j["rank"] = c->rank;
  j["size"] = c->size;
  j["transport"] = c->transport ? c->transport->name() : "";
  j["tls"] = c->settings.tls;
  const FlightRecorder::Now at = c->recorder.now();
  j["running"] = at.running;
  j["seq"] = at.seq;
  j["collective"] = transport::coll_name(at.coll);
  j["elapsed_s"] = at.running && now_ns > at.start_ns ? static_cast<double>(now_ns - at.start_ns) * 1e-9 : 0.0;
  j["last_done_seq"] = at.last_done_seq;
  j["operations"] = at.operations;
  nlohmann::json colls = nlohmann::json::array();
  for (size_t k = 1; k < kKinds; ++k) {
    const CollStats& s = c->stats.coll(k);
    const uint64_t calls = s.calls.load(std::memory_order_relaxed);
    if (calls == 0) continue;
    nlohmann::json buckets = nlohmann::json::array();
    for (const auto& b : s.buckets) buckets.push_back(b.load(std::memory_order_relaxed));
    const char* algo = s.algorithm.load(std::memory_order_relaxed);
    colls.push_back({{"collective", transport::coll_name(static_cast<transport::CollKind>(k))},
                     {"calls", calls},
                     {"bytes", s.bytes.load(std::memory_order_relaxed)},
                     {"sum_s", static_cast<double>(s.sum_ns.load(std::memory_order_relaxed)) * 1e-9},
                     {"buckets", buckets},
                     {"algorithm", algo != nullptr ? algo : ""}});
  }
  j["collectives"] = colls;
  nlohmann::json errors = nlohmann::json::object();
  for (size_t code = 1; code < kStatusCodes; ++code) errors[status_label(code)] = c->stats.errors(code);
  j["errors"] = errors;
  j["straggler"] = {{"rank", c->stats.straggler()},
                    {"count", c->stats.straggler_count()},
                    {"wait_s", static_cast<double>(c->stats.straggler_wait_ns()) * 1e-9}};
  nlohmann::json peers = nlohmann::json::array();
  if (const transport::Arrivals* a = c->arrivals.get()) {
    // A peer is awaited while the running collective has not had its first message yet; only
    // peers that sent this rank first messages before are candidates (those it receives from).
    const uint64_t running = a->running_seq();
    // Listed: the peers this rank exchanged with, the most waited on first (over the whole call
    // and for first messages) when more than kMaxPeers did.
    std::vector<std::pair<uint64_t, int>> order;
    for (int p = 0; p < a->size(); ++p)
      if (a->messages(p) != 0 || a->sent_bytes(p) != 0 || a->recv_bytes(p) != 0 || a->reconnects(p) != 0)
        order.emplace_back(a->wait_ns(p) + a->recv_wait_ns(p), p);
    std::sort(order.begin(), order.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    if (order.size() > kMaxPeers) order.resize(kMaxPeers);
    std::sort(order.begin(), order.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
    for (const auto& [ignored, p] : order)
      peers.push_back({{"peer", p},
                       {"first_messages", a->messages(p)},
                       {"wait_s", static_cast<double>(a->wait_ns(p)) * 1e-9},
                       {"recv_wait_s", static_cast<double>(a->recv_wait_ns(p)) * 1e-9},
                       {"flow_wait_s", static_cast<double>(a->flow_wait_ns(p)) * 1e-9},
                       {"sent_bytes", a->sent_bytes(p)},
                       {"received_bytes", a->recv_bytes(p)},
                       {"reconnects", a->reconnects(p)},
                       {"late", c->stats.late(p)},
                       {"awaited", running != 0 && a->messages(p) != 0 && a->last_seq(p) < running}});
  }
  j["peers"] = peers;
  const Stats::EngineTotals e = c->stats.engine();
  if (e.steps != 0)
    j["engine"] = {{"steps", e.steps},          {"step_s", e.step_s},
                   {"exposed_s", e.exposed_s},  {"comm_s", e.comm_s},
                   {"last_exposed_s", e.last_exposed_s}, {"last_overlap", e.last_overlap}};
  return j;
}

}  // namespace

size_t snapshot(char* out, size_t cap) {
  const uint64_t now = transport::Arrivals::now_ns();
  nlohmann::json j;
  j["version"] = version::text();
  nlohmann::json bounds = nlohmann::json::array();
  for (double b : kLatencyBounds) bounds.push_back(b);
  j["latency_bounds_s"] = bounds;
  nlohmann::json comms = nlohmann::json::array();
  for_each_live([&](comm_t c) { comms.push_back(describe(c, now)); });
  j["comms"] = comms;
  const std::string text = j.dump();
  if (text.size() < cap) std::memcpy(out, text.c_str(), text.size() + 1);
  return text.size();
}

}  // namespace comm::observe

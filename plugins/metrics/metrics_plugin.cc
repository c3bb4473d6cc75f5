// libcomm's metrics plugin (docs/observability.md): Prometheus's text exposition of libcomm's
// counters over HTTP, with prometheus-cpp (its pull exposer runs civetweb), opened by libcomm only
// when COMM_METRICS_ADDR or COMM_METRICS_TEXTFILE is set (libcomm/src/observe/metrics.cc).
// Each scrape asks libcomm for a snapshot (JSON, counts only) and turns it into metric families, so
// a destroyed communicator's series go with it and nothing is counted twice.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/text_serializer.h>
#include <string>
#include <vector>

#include "observe/metrics_plugin.h"

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

const comm_metrics_host* g_host = nullptr;

nlohmann::json take_snapshot() {
  std::string buf(64 * 1024, '\0');
  for (int tries = 0; tries < 4; ++tries) {
    const size_t n = g_host->snapshot(buf.data(), buf.size());
    if (n < buf.size()) return nlohmann::json::parse(buf.c_str(), nullptr, false);
    buf.assign(n + 4096, '\0');  // communicators came meanwhile: once more, larger
  }
  return nlohmann::json::object();
}

// The families of one scrape, keyed by name in the order they are first used.
class Families {
 public:
  MetricFamily& get(const std::string& name, const std::string& help, MetricType type) {
    for (auto& f : families_)
      if (f.name == name) return f;
    families_.push_back(MetricFamily{name, help, type, {}});
    return families_.back();
  }
  ClientMetric& add(const std::string& name, const std::string& help, MetricType type,
                    std::vector<ClientMetric::Label> labels) {
    MetricFamily& f = get(name, help, type);
    f.metric.emplace_back();
    f.metric.back().label = std::move(labels);
    return f.metric.back();
  }
  void counter(const std::string& name, const std::string& help, std::vector<ClientMetric::Label> labels, double v) {
    add(name, help, MetricType::Counter, std::move(labels)).counter.value = v;
  }
  void gauge(const std::string& name, const std::string& help, std::vector<ClientMetric::Label> labels, double v) {
    add(name, help, MetricType::Gauge, std::move(labels)).gauge.value = v;
  }
  std::vector<MetricFamily> take() { return std::move(families_); }

 private:
  std::vector<MetricFamily> families_;
};

std::string text(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}
double num(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::vector<MetricFamily> collect() {
  Families out;
  const nlohmann::json snap = take_snapshot();
  if (!snap.is_object()) return out.take();
  out.gauge("libcomm_build_info", "libcomm's version in this process (always 1)", {{"version", text(snap, "version")}},
            1);
  std::vector<double> bounds;
  if (auto b = snap.find("latency_bounds_s"); b != snap.end() && b->is_array())
    for (const auto& v : *b) bounds.push_back(v.get<double>());
  auto comms = snap.find("comms");
  if (comms == snap.end() || !comms->is_array()) return out.take();
  for (const auto& c : *comms) {
    const std::string comm = text(c, "comm"), rank = text(c, "rank");
    const std::vector<ClientMetric::Label> base = {{"comm", comm}, {"rank", rank}};
    auto with = [&](std::vector<ClientMetric::Label> more) {
      std::vector<ClientMetric::Label> l = base;
      l.insert(l.end(), more.begin(), more.end());
      return l;
    };
    out.gauge("libcomm_comm_info", "a live communicator: its size, transport and whether TLS protects it (always 1)",
              with({{"size", text(c, "size")}, {"transport", text(c, "transport")},
                    {"tls", c.value("tls", false) ? "1" : "0"}}),
              1);
    out.gauge("libcomm_operation_running", "1 while an operation runs on the communicator", base,
              c.value("running", false) ? 1 : 0);
    out.gauge("libcomm_operation_seq", "the latest operation's sequence number (running or not)", base,
              num(c, "seq"));
    out.gauge("libcomm_operation_elapsed_seconds", "how long the running operation has run (0 between operations)",
              base, num(c, "elapsed_s"));
    out.gauge("libcomm_operation_info", "the latest operation's collective (always 1)",
              with({{"collective", text(c, "collective")}}), 1);
    out.gauge("libcomm_last_completed_seq", "the sequence number of the latest operation that ended", base,
              num(c, "last_done_seq"));
    for (const auto& k : c.value("collectives", nlohmann::json::array())) {
      const auto labels = with({{"collective", text(k, "collective")}});
      out.counter("libcomm_collective_calls_total", "calls of each collective", labels, num(k, "calls"));
      out.counter("libcomm_collective_bytes_total", "bytes of each collective's calls, as nccl-tests' size column",
                  labels, num(k, "bytes"));
      ClientMetric& h = out.add("libcomm_collective_duration_seconds", "how long each call took on this rank",
                                MetricType::Histogram, labels);
      h.histogram.sample_count = static_cast<uint64_t>(num(k, "calls"));
      h.histogram.sample_sum = num(k, "sum_s");
      uint64_t cumulative = 0;
      const auto& buckets = k["buckets"];
      for (size_t i = 0; i < buckets.size(); ++i) {
        cumulative += buckets[i].get<uint64_t>();
        const double le = i < bounds.size() ? bounds[i] : std::numeric_limits<double>::infinity();
        h.histogram.bucket.push_back({cumulative, le});
      }
      out.gauge("libcomm_collective_algorithm_info", "the algorithm of each collective's latest call (always 1)",
                with({{"collective", text(k, "collective")}, {"algorithm", text(k, "algorithm")}}), 1);
    }
    const nlohmann::json errors = c.value("errors", nlohmann::json::object());  // kept: items() refers to it
    for (const auto& [kind, n] : errors.items())
      out.counter("libcomm_errors_total", "operations that failed, by kind", with({{"kind", kind}}),
                  n.is_number() ? n.get<double>() : 0.0);
    const auto& s = c["straggler"];
    out.gauge("libcomm_straggler_rank",
              "the peer this rank named a straggler over its last 100 collectives (-1: none; COMM_STRAGGLER_MS)", base,
              num(s, "rank"));
    out.gauge("libcomm_straggler_late_ratio", "in how many of those 100 collectives the straggler came last and late",
              base, num(s, "count") / 100.0);
    out.gauge("libcomm_straggler_wait_seconds", "this rank's mean wait for the straggler's first message then", base,
              num(s, "wait_s"));
    for (const auto& p : c.value("peers", nlohmann::json::array())) {
      const auto labels = with({{"peer", text(p, "peer")}});
      out.counter("libcomm_peer_first_messages_total", "collectives in which a first message came from this peer",
                  labels, num(p, "first_messages"));
      out.counter("libcomm_peer_wait_seconds_total",
                  "this rank's waits, from each collective's start, for this peer's first message", labels,
                  num(p, "wait_s"));
      out.counter("libcomm_peer_late_total",
                  "collectives in which this peer's first message came last and COMM_STRAGGLER_MS late or more",
                  labels, num(p, "late"));
      out.counter("libcomm_peer_recv_wait_seconds_total",
                  "time this rank's waits blocked with a receive from this peer unfinished, over whole calls", labels,
                  num(p, "recv_wait_s"));
      out.counter("libcomm_peer_transfer_wait_seconds_total",
                  "the part of those waits after the peer's message had begun to arrive (a slow link or sender)",
                  labels, num(p, "flow_wait_s"));
      out.counter("libcomm_peer_sent_bytes_total", "payload bytes of messages this rank sent to this peer", labels,
                  num(p, "sent_bytes"));
      out.counter("libcomm_peer_received_bytes_total", "payload bytes of messages this rank received from this peer",
                  labels, num(p, "received_bytes"));
      out.counter("libcomm_peer_reconnects_total", "connections to this peer dialed again after a failed attempt",
                  labels, num(p, "reconnects"));
      out.gauge("libcomm_peer_awaited", "1 while the running collective still waits for this peer's first message",
                labels, p.value("awaited", false) ? 1 : 0);
    }
    if (auto e = c.find("engine"); e != c.end() && e->is_object()) {
      out.counter("libcomm_engine_steps_total", "synced steps of the gradient engine on this communicator", base,
                  num(*e, "steps"));
      out.counter("libcomm_engine_step_seconds_total", "those steps' time, begin to end returning", base,
                  num(*e, "step_s"));
      out.counter("libcomm_engine_exposed_comm_seconds_total",
                  "the part of those steps the trainer blocked on communication (exposed)", base, num(*e, "exposed_s"));
      out.counter("libcomm_engine_comm_seconds_total", "the steps' communication time (partitions' start to done)",
                  base, num(*e, "comm_s"));
      out.gauge("libcomm_engine_exposed_comm_seconds", "the last synced step's exposed communication time", base,
                num(*e, "last_exposed_s"));
      out.gauge("libcomm_engine_overlap_ratio", "the last synced step's overlap: 1 - exposed / communication time",
                base, num(*e, "last_overlap"));
    }
  }
  return out.take();
}

class Source final : public prometheus::Collectable {
 public:
  std::vector<MetricFamily> Collect() const override { return collect(); }
};

void say(char* why, size_t cap, const std::string& what) {
  if (cap == 0) return;
  std::snprintf(why, cap, "%s", what.c_str());
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int comm_metrics_plugin_start_v1(const comm_metrics_host* host,
                                                                                  const char* address, int port,
                                                                                  char* why, size_t why_cap) {
  if (host == nullptr || host->version != COMM_METRICS_PLUGIN_VERSION) {
    say(why, why_cap, "the plugin speaks interface version " + std::to_string(COMM_METRICS_PLUGIN_VERSION) +
                          " and libcomm another: install the plugin built with this libcomm");
    return -1;
  }
  g_host = host;
  const std::string a = address;
  const std::string bind = (a.find(':') != std::string::npos ? "[" + a + "]" : a) + ":" + std::to_string(port);
  try {
    // Never destroyed: its threads may serve a scrape while the process exits, and libcomm's
    // registry outlives them (libcomm/src/observe/live.cc).
    static auto* source = new std::shared_ptr<Source>(std::make_shared<Source>());
    auto* exposer = new prometheus::Exposer(bind, 1);
    exposer->RegisterCollectable(*source);
    const std::vector<int> ports = exposer->GetListeningPorts();
    return ports.empty() ? port : ports.front();
  } catch (const std::exception& e) {
    say(why, why_cap, std::string("cannot listen on ") + bind + ": " + e.what());
    return -1;
  }
}

extern "C" __attribute__((visibility("default"))) int comm_metrics_plugin_write_v1(const comm_metrics_host* host,
                                                                                  const char* path, char* why,
                                                                                  size_t why_cap) {
  if (host == nullptr || host->version != COMM_METRICS_PLUGIN_VERSION) {
    say(why, why_cap, "the plugin and libcomm speak different interface versions");
    return -1;
  }
  g_host = host;
  const std::string file = path, tmp = file + ".tmp" + std::to_string(getpid());
  try {
    const std::string body = prometheus::TextSerializer().Serialize(collect());
    std::ofstream out(tmp, std::ios::trunc);
    out << body;
    out.close();
    if (!out || std::rename(tmp.c_str(), file.c_str()) != 0) {
      const int err = errno;
      std::remove(tmp.c_str());
      say(why, why_cap, std::string(std::strerror(err)));
      return -1;
    }
  } catch (const std::exception& e) {
    say(why, why_cap, e.what());
    return -1;
  }
  return 0;
}

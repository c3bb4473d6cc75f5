#include "results.h"

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>

#include "values.h"

namespace bench {
namespace {

nlohmann::json to_json(const Measure& m) {
  nlohmann::json j = {{"time_us", m.time_us}, {"algbw", m.algbw}, {"busbw", m.busbw}};
  j["wrong"] = m.wrong < 0 ? nlohmann::json(nullptr) : nlohmann::json(m.wrong);
  return j;
}

const char* average_name(Average a) {
  switch (a) {
    case Average::kRank0: return "rank0";
    case Average::kMean: return "mean";
    case Average::kMin: return "min";
    case Average::kMax: return "max";
  }
  return "?";
}

// "1.0.0 (git 868ddb39b8cc)" -> "868ddb39b8cc"; "" when the version names none.
std::string commit_of(const std::string& version) {
  const size_t at = version.find("(git ");
  if (at == std::string::npos) return "";
  const size_t end = version.find(')', at);
  return version.substr(at + 5, end == std::string::npos ? std::string::npos : end - at - 5);
}

std::string now_utc() {
  char text[32] = "";
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

}  // namespace

std::string write_json(const std::string& path, const Run& run, const Options& opt) {
  nlohmann::json rows = nlohmann::json::array();
  for (const Row& r : run.rows)
    rows.push_back({{"size", r.size}, {"count", r.count}, {"type", r.type}, {"redop", r.redop}, {"root", r.root},
                    {"out_of_place", to_json(r.out_of_place)}, {"in_place", to_json(r.in_place)}});
  nlohmann::json env = nlohmann::json::object();
  for (const auto& [name, value] : run.environment) env[name] = value;
  nlohmann::json j = {
      {"format", "comm-bench/1"},
      {"library", run.library},
      {"version", run.version},
      {"commit", commit_of(run.version)},
      {"host", run.host},
      {"environment", env},
      {"label", run.label},
      {"collective", run.collective},
      {"transport", run.transport},
      {"algorithm", run.algorithm},
      {"nranks", run.nranks},
      {"date", now_utc()},
      {"command", opt.argv},
      {"iters", opt.iters},
      {"warmup_iters", opt.warmup_iters},
      {"average", average_name(opt.average)},
      {"blocking", opt.blocking},
      {"registered", opt.registered},
      {"device", opt.device},
      {"agg_iters", opt.agg_iters},
      {"run_cycles", opt.run_cycles},
      {"cputime", opt.cputime},
      {"graph", opt.graph_launches},
      {"timeout_s", opt.timeout_s},
      {"rows", rows},
      {"out_of_bounds", run.out_of_bounds},
      {"avg_busbw", run.avg_busbw},
  };
  std::ofstream out(path);
  out << j.dump(1) << '\n';
  out.close();
  return out ? "" : "cannot write " + path + ": " + std::strerror(errno);
}

std::string write_csv(const std::string& path, const Run& run) {
  std::ofstream out(path);
  out << "library,label,collective,transport,algorithm,nranks,size,count,type,redop,root,"
         "oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us,ip_algbw,ip_busbw,ip_wrong\n";
  auto measure = [&](const Measure& m) {
    out << ',' << m.time_us << ',' << m.algbw << ',' << m.busbw << ',';
    if (m.wrong >= 0) out << m.wrong;
  };
  auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return q + "\"";
  };
  for (const Row& r : run.rows) {
    out << run.library << ',' << quoted(run.label) << ',' << run.collective << ',' << quoted(run.transport) << ','
        << quoted(run.algorithm) << ',' << run.nranks << ',' << r.size << ',' << r.count << ',' << r.type << ','
        << r.redop << ',' << r.root;
    measure(r.out_of_place);
    measure(r.in_place);
    out << '\n';
  }
  out.close();
  return out ? "" : "cannot write " + path + ": " + std::strerror(errno);
}

}  // namespace bench

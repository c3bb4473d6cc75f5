// What one run measured, and its JSON and CSV forms (read by compare.py and plot_busbw.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "options.h"

namespace bench {

struct Measure {
  double time_us = 0;
  double algbw = 0;  // GB/s, 1e9 bytes
  double busbw = 0;
  int64_t wrong = -1;  // -1: not checked (printed "N/A", as nccl-tests)
};

struct Row {
  size_t size = 0;  // bytes, nccl-tests' "size": the larger of send and receive buffer
  size_t count = 0;
  std::string type;
  std::string redop;
  int root = -1;
  Measure out_of_place;
  Measure in_place;
};

struct Run {
  std::string library;
  std::string version;  // the library's release and commit ("" when it does not say)
  std::string host;     // rank 0's hostname
  std::vector<std::pair<std::string, std::string>> environment;  // every COMM_* / NCCL_* set
  std::string label;
  std::string collective;
  std::string transport;
  std::string algorithm;
  int nranks = 0;
  std::vector<Row> rows;
  int out_of_bounds = 0;  // sizes whose check failed
  double avg_busbw = 0;
};

// Both return "" or why the file could not be written.
std::string write_json(const std::string& path, const Run& run, const Options& opt);
std::string write_csv(const std::string& path, const Run& run);

}  // namespace bench

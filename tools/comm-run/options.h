// comm-run's command line: what the user asked for, parsed and checked once.
#pragma once

#include <cstdio>
#include <vector>

namespace comm_run {

enum class Bind { kNone, kCore };
enum class Prefix { kAuto, kAlways, kQuiet, kNone };

struct Options {
  int nranks = 0;
  Bind bind = Bind::kCore;
  double timeout_s = 0;  // 0: no limit
  double grace_s = 5;    // SIGTERM -> SIGKILL
  Prefix prefix = Prefix::kAuto;
  bool print_params = false;
  bool replace_failed = false;  // --replace-failed: replace_failed.h
  std::vector<char*> program;  // argv of the rank program, null-terminated

  // Whether rank output goes through comm-run's pipes to get "[rank] " prefixes.
  bool prefixed() const {
    return prefix == Prefix::kAlways || prefix == Prefix::kQuiet || (prefix == Prefix::kAuto && nranks > 1);
  }
};

constexpr int kMaxRanks = 4096;

void usage(FILE* out);

// Returns -1 to go on, otherwise the exit status for main.
int parse_options(int argc, char** argv, Options* opt);

}  // namespace comm_run

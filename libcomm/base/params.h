// One registry of every knob libcomm reads: name, type, default, doc (UCC's model).
// Environment variables are read here and nowhere else; `comm-run --params` prints them all.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "status.h"

namespace comm::params {

enum class Type { kInt, kString, kEnum };

struct Param {
  const char* name;     // the environment variable
  Type type;
  const char* fallback;  // default value as text ("" = unset)
  const char* doc;
  const char* choices;  // kEnum: comma list of allowed values; otherwise nullptr
};

const std::vector<Param>& all();

// The raw environment value (nullopt when unset or empty). For variables not in the
// registry this aborts in debug builds: every variable must be declared.
std::optional<std::string> env(const char* name);

// Typed reads with validation; the error names the variable and the bad value.
Status get_int(const char* name, int64_t min, int64_t max, int64_t* out);  // env or default
Status get_string(const char* name, std::string* out);                       // env or default
// Parse an integer environment variable that has no default (RANK, WORLD_SIZE, ...).
// *present=false when unset. A malformed or out-of-range value is INVALID_ARGUMENT naming it.
Status get_optional_int(const char* name, int64_t min, int64_t max, int64_t* out, bool* present);

// "NAME=value (default ...): doc" lines for every knob.
std::string describe_all();

// Every COMM_* and NCCL_* variable set in the environment, "NAME=value" in name order, for the
// init log line; a secret (COMM_AUTH_TOKEN, names with TOKEN/SECRET/PASSWORD) shows as "NAME=(set)".
std::vector<std::string> set_variables();

// One message per COMM_* variable set that is not in the registry (a typo like COMM_TIMEOUT),
// naming the registered one nearest in edit distance.
std::vector<std::string> unknown_variables();

// The nearest registered name to `name` (Levenshtein distance; ties: the first in the registry).
std::string nearest_name(const std::string& name);

}  // namespace comm::params

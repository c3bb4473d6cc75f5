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

// One row per knob: its default and (integers) its range are stated here and nowhere else; the
// floor that uses it reads it through get_int / int_or_default.
struct Param {
  const char* name;     // the environment variable
  Type type;
  const char* fallback;  // default value as text ("" = unset)
  const char* doc;
  const char* choices;  // kEnum: comma list of allowed values; otherwise nullptr
  int64_t min = 0, max = 0;  // kInt: the values accepted
};

const std::vector<Param>& all();
const Param* find(const char* name);  // nullptr when not in the registry

// The raw environment value (nullopt when unset or empty). For variables not in the
// registry this aborts in debug builds: every variable must be declared.
std::optional<std::string> env(const char* name);

// Typed reads with validation; the error names the variable and the bad value.
// An integer knob: the environment's value, else the default; out of the row's range is
// INVALID_ARGUMENT naming the variable, the value and the range.
Status get_int(const char* name, int64_t* out);
// The same where a bad value must not fail anything: it warns (log subsystem `subsys`, naming
// the variable and the default) and the default is used.
int64_t int_or_default(const char* name, uint32_t subsys);
Status get_string(const char* name, std::string* out);                       // env or default
// Parse an integer environment variable that has no default (RANK, WORLD_SIZE, ...).
// *present=false when unset. A malformed or out-of-range value is INVALID_ARGUMENT naming it.
Status get_optional_int(const char* name, int64_t min, int64_t max, int64_t* out, bool* present);

// COMM_SOCKET_CONNECT_TIMEOUT_MS's default, named because structs of other floors start from it
// (transports/socket/mesh.h, libcomm/src/reachability.h); the registry's row is written from it.
inline constexpr int kSocketConnectTimeoutDefaultMs = 4000;

// COMM_SOCKET_CONNECT_TIMEOUT_MS, the one reader for every floor that dials: how long one
// address's TCP handshake may go unanswered (a firewall that drops packets). A value out of the
// row's range is INVALID_ARGUMENT naming it, with *out the default then: init refuses it, a dialer
// that must not fail (the store's client, the verdict tree) ignores the error.
Status socket_connect_timeout_ms(int* out);

// "NAME=value (default|set)" and its doc, choices and range, for every knob (comm-run --params).
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

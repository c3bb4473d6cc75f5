// The params registry: one row per knob, its default and range stated there once (params.cc),
// read through get_int / int_or_default, printed by comm-run --params.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <optional>
#include <string>

#include "log.h"
#include "params.h"

using namespace comm;

namespace {

// Sets one variable for the test and puts the original back afterwards.
class ScopedVar {
 public:
  ScopedVar(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) saved_ = v;
    setenv(name, value, 1);
  }
  ~ScopedVar() {
    if (saved_)
      setenv(name_, saved_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

}  // namespace

TEST_CASE("params: every integer knob's default lies in its own range", "[params]") {
  int integers = 0;
  for (const auto& p : params::all()) {
    if (p.type != params::Type::kInt) continue;
    ++integers;
    INFO(p.name);
    CHECK(p.min <= p.max);
    char* end = nullptr;
    const long long d = std::strtoll(p.fallback, &end, 10);
    CHECK(*end == '\0');
    CHECK(d >= p.min);
    CHECK(d <= p.max);
  }
  CHECK(integers >= 20);
}

TEST_CASE("params: a value outside the row's range is refused, naming the variable and the range", "[params]") {
  ScopedVar ring("COMM_RING_DEPTH", "5");
  int64_t v = 0;
  Status st = params::get_int("COMM_RING_DEPTH", &v);
  CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
  CHECK(st.message().find("COMM_RING_DEPTH=5 is out of range [2, 4]") != std::string::npos);
  // Where a bad value must not fail anything: the row's default.
  CHECK(params::int_or_default("COMM_RING_DEPTH", log::kAlg) == 2);
}

TEST_CASE("params: a value inside the range is read as set", "[params]") {
  ScopedVar sends("COMM_RING_SENDS", "16");
  int64_t v = 0;
  REQUIRE(params::get_int("COMM_RING_SENDS", &v).ok());
  CHECK(v == 16);
  CHECK(params::int_or_default("COMM_RING_SENDS", log::kAlg) == 16);
}

TEST_CASE("params: an unset knob reads as its row's default", "[params]") {
  unsetenv("COMM_SMALL_MSG_BYTES");
  CHECK(params::int_or_default("COMM_SMALL_MSG_BYTES", log::kAlg) == 65536);
}

TEST_CASE("params: comm-run --params prints each integer knob's range from its row", "[params]") {
  const std::string text = params::describe_all();
  CHECK(text.find("COMM_RING_DEPTH=2  (default)") != std::string::npos);
  CHECK(text.find("[2..4]") != std::string::npos);
  CHECK(text.find("[1..16]") != std::string::npos);
}

TEST_CASE("params: COMM_SOCKET_CONNECT_TIMEOUT_MS has one reader, its default the named constant", "[params]") {
  const params::Param* row = params::find("COMM_SOCKET_CONNECT_TIMEOUT_MS");
  REQUIRE(row != nullptr);
  CHECK(std::string(row->fallback) == std::to_string(params::kSocketConnectTimeoutDefaultMs));
  int ms = -1;
  {
    ScopedVar unset("COMM_SOCKET_CONNECT_TIMEOUT_MS", "");  // empty reads as unset
    REQUIRE(params::socket_connect_timeout_ms(&ms).ok());
    CHECK(ms == params::kSocketConnectTimeoutDefaultMs);
  }
  {
    ScopedVar set("COMM_SOCKET_CONNECT_TIMEOUT_MS", "250");
    REQUIRE(params::socket_connect_timeout_ms(&ms).ok());
    CHECK(ms == 250);
  }
  {
    // Refused, naming it; the default for a dialer that must not fail.
    ScopedVar bad("COMM_SOCKET_CONNECT_TIMEOUT_MS", "5");
    ms = -1;
    const Status st = params::socket_connect_timeout_ms(&ms);
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK(st.message().find("COMM_SOCKET_CONNECT_TIMEOUT_MS=5 is out of range [100, 600000]") != std::string::npos);
    CHECK(ms == params::kSocketConnectTimeoutDefaultMs);
  }
}

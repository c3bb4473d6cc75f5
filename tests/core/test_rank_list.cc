// The rank-list text of the job store's records (libcomm/src/rank_list.h): both spellings byte
// for byte as running jobs' stores hold them, the round trip, and that every malformed text is
// refused whole with a message that quotes it.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "rank_list.h"

using comm::parse_rank_list;
using comm::rank_list_bare;
using comm::rank_list_bracketed;

TEST_CASE("rank lists are written as the store's records hold them", "[rank_list]") {
  CHECK(rank_list_bare({}) == "");
  CHECK(rank_list_bare({7}) == "7");
  CHECK(rank_list_bare({1, 3, 12}) == "1,3,12");
  CHECK(rank_list_bracketed({}) == "[]");
  CHECK(rank_list_bracketed({0}) == "[0]");
  CHECK(rank_list_bracketed({1, 3, 12}) == "[1,3,12]");
}

TEST_CASE("rank lists read back what was written, in order and with repeats", "[rank_list]") {
  const std::vector<std::vector<int>> lists = {{}, {0}, {5, 5, 0, 2}, {1, 2, 3, 1023}};
  for (const auto& list : lists) {
    std::vector<int> back = {99};  // replaced, not appended to
    REQUIRE(parse_rank_list(rank_list_bare(list), 1024, &back).ok());
    CHECK(back == list);
    back = {99};
    REQUIRE(parse_rank_list(rank_list_bracketed(list), 1024, &back).ok());
    CHECK(back == list);
  }
}

TEST_CASE("a malformed rank list is refused whole, quoted in the error", "[rank_list]") {
  struct Bad {
    std::string text, why;
  };
  const std::vector<Bad> bad = {
      {"[1,3", "without its closing ']'"},
      {"[", "without its closing ']'"},
      {"1,3]", "\"3]\" is not a decimal number"},
      {"1,,3", "an empty item at offset 2"},
      {"1,3,", "an empty item at offset 4"},
      {",1", "an empty item at offset 0"},
      {"[,]", "an empty item"},
      {"1, 3", "\" 3\" is not a decimal number"},
      {"-1", "\"-1\" is not a decimal number"},
      {"1;3", "\"1;3\" is not a decimal number"},
      {"4", "\"4\" is not below 4"},
      {"99999999999999999999", "is not below 4"},
      {"[[1]]", "\"[1]\" is not a decimal number"},
  };
  for (const auto& b : bad) {
    INFO(b.text);
    std::vector<int> out = {1, 2};
    const comm::Status st = parse_rank_list(b.text, 4, &out);
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == COMM_ERR_INVALID_ARGUMENT);
    CHECK(out.empty());
    CHECK_THAT(st.message(), Catch::Contains("malformed rank list \"" + b.text + "\"") && Catch::Contains(b.why));
  }
}

TEST_CASE("an error quotes a long rank list cut short", "[rank_list]") {
  const std::string text(1000, '1');
  std::vector<int> out;
  const comm::Status st = parse_rank_list(text, 4, &out);
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().size() < 400);
  CHECK_THAT(st.message(), Catch::Contains("...\""));
}

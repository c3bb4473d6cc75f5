// The rank-list text of the job store's records (rank_list.h: the two spellings and who writes
// which).
#include "rank_list.h"

#include <algorithm>

namespace comm {
namespace {

// Longer texts are quoted cut short in errors: the text came from another process.
constexpr size_t kQuoted = 64;

std::string quoted(const std::string& text) {
  return "\"" + (text.size() <= kQuoted ? text : text.substr(0, kQuoted) + "...") + "\"";
}

}  // namespace

std::string rank_list_bare(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += ',';
    text += std::to_string(ranks[i]);  // appended apart: GCC 12 warns (-Wrestrict) on "," + to_string
  }
  return text;
}

std::string rank_list_bracketed(const std::vector<int>& ranks) {
  std::string text = "[";
  text += rank_list_bare(ranks);
  text += ']';
  return text;
}

Status parse_rank_list(const std::string& text, int limit, std::vector<int>* out) {
  out->clear();
  auto malformed = [&](const std::string& why) {
    out->clear();
    return InvalidArgument("malformed rank list " + quoted(text) + ": " + why);
  };
  size_t begin = 0, end = text.size();
  if (!text.empty() && text.front() == '[') {
    if (text.back() != ']' || text.size() < 2) return malformed("a '[' without its closing ']'");
    begin = 1;
    end = text.size() - 1;
  }
  if (begin == end) return Status::Ok();  // "" or "[]"
  for (size_t pos = begin; pos <= end;) {
    const size_t comma = std::min(text.find(',', pos), end);
    const std::string item = text.substr(pos, comma - pos);
    if (item.empty()) return malformed("an empty item at offset " + std::to_string(pos));
    if (item.find_first_not_of("0123456789") != std::string::npos)
      return malformed("item " + quoted(item) + " is not a decimal number");
    long long v = 0;
    for (char ch : item) {
      v = v * 10 + (ch - '0');
      if (v >= limit) return malformed("item " + quoted(item) + " is not below " + std::to_string(limit));
    }
    out->push_back(static_cast<int>(v));
    pos = comma + 1;
  }
  return Status::Ok();
}

}  // namespace comm

// The text of a list of ranks (or other small non-negative numbers) as the job store holds it.
// Two spellings of one format, written by different records and kept byte for byte, since
// running jobs and tests read them:
//   "1,3"    bare: comm_grow's answer record (grow_records.cc: host_of, world_ranks);
//   "[1,3]"  bracketed: comm_agree_failed's check-ins and verdicts (agree.cc), comm_shrink's
//            excluded lists (shrink.cc), and every message that names ranks.
// One parser reads both. Another process wrote what it reads, so it trusts nothing: a malformed
// list is an error that says what is wrong, never a list that is partly right.
#pragma once

#include <string>
#include <vector>

#include "status.h"

namespace comm {

// "1,3" ("" for none).
std::string rank_list_bare(const std::vector<int>& ranks);

// "[1,3]" ("[]" for none).
std::string rank_list_bracketed(const std::vector<int>& ranks);

// Reads either spelling, in its order (repeats kept: host numbers repeat): every item a decimal
// number in [0, limit), items separated by single commas, no spaces. "" and "[]" are the empty
// list. On a malformed text *out is empty and the status (InvalidArgument) quotes it.
Status parse_rank_list(const std::string& text, int limit, std::vector<int>* out);

}  // namespace comm

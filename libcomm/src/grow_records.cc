// What comm_grow's members and joiners leave in the job store for each other (grow.h: the
// keys), and the exclusions comm_agree_failed records for the launcher. Everything read here
// was written by another process: nothing is trusted, a malformed record is refused.

#include "grow.h"
#include "hash.h"
#include "init_agreement.h"
#include "log.h"
#include "rank_list.h"

namespace comm::grow {
namespace {

constexpr char kSep = '\x1d';

bool parse_int(const std::string& text, long lo, long hi, int* out) {
  if (text.empty() || text.size() > 10) return false;
  size_t i = text[0] == '-' ? 1 : 0;
  if (i == text.size() || text.find_first_not_of("0123456789", i) != std::string::npos) return false;
  const long v = std::stol(text);
  if (v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

// host_of and world_ranks: the bare spelling (rank_list.h), numbers up to 2^30 as parse_int's.
bool parse_numbers(const std::string& text, std::vector<int>* out) {
  return parse_rank_list(text, (1 << 30) + 1, out).ok();
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  size_t pos = 0;
  for (;;) {
    const size_t end = text.find(sep, pos);
    parts.push_back(text.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
    if (end == std::string::npos) return parts;
    pos = end + 1;
  }
}

}  // namespace

std::string encode_hello(const Hello& h) {
  return std::to_string(h.slot) + kSep + std::to_string(h.host) + kSep + h.reach + kSep + h.settings;
}

bool decode_hello(const std::string& text, Hello* h) {
  // The settings last: they hold separators of their own (init_agreement.cc's encoding).
  const size_t a = text.find(kSep);
  const size_t b = a == std::string::npos ? a : text.find(kSep, a + 1);
  const size_t c = b == std::string::npos ? b : text.find(kSep, b + 1);
  if (c == std::string::npos) return false;
  const std::string host = text.substr(a + 1, b - a - 1);
  if (!parse_int(text.substr(0, a), -1, 1 << 30, &h->slot) || host.empty() || host.size() > 20 ||
      host.find_first_not_of("0123456789") != std::string::npos)
    return false;
  h->host = std::stoull(host);
  h->reach = text.substr(b + 1, c - b - 1);
  h->settings = text.substr(c + 1);
  return true;
}

std::string encode_answer(const Answer& a) {
  std::string addrs;
  for (const auto& w : a.world_addrs) addrs += (addrs.empty() ? "" : " ") + (w.empty() ? std::string("-") : w);
  return "OK\n" + a.id + "\n" + a.secret + "\n" + std::to_string(a.rank) + "\n" +
         (a.local_transport_usable ? "1" : "0") + "\n" + rank_list_bare(a.host_of) + "\n" +
         rank_list_bare(a.world_ranks) + "\n" + rank_list_bare(a.world_gens) + "\n" + addrs;
}

bool decode_answer(const std::string& text, Answer* a) {
  const std::vector<std::string> lines = split(text, '\n');
  if (lines.size() != 9 || lines[0] != "OK" || lines[1].empty() || lines[2].empty()) return false;
  a->id = lines[1];
  a->secret = lines[2];
  if (!parse_int(lines[3], 0, 1 << 30, &a->rank) || (lines[4] != "0" && lines[4] != "1")) return false;
  a->local_transport_usable = lines[4] == "1";
  if (!parse_numbers(lines[5], &a->host_of) || !parse_numbers(lines[6], &a->world_ranks) ||
      !parse_numbers(lines[7], &a->world_gens))
    return false;
  if (a->host_of.size() != a->world_ranks.size() || a->world_gens.size() != a->world_ranks.size() ||
      a->rank >= static_cast<int>(a->host_of.size()))
    return false;
  a->world_addrs.clear();
  for (const auto& w : split(lines[8], ' ')) a->world_addrs.push_back(w == "-" ? "" : w);
  for (int w : a->world_ranks)
    if (static_cast<size_t>(w) >= a->world_addrs.size()) return false;
  return true;
}

std::string encode_decided(const DecidedJoiner& j) {
  return std::to_string(j.world) + " " + std::to_string(j.gen) + " " + std::to_string(j.host) + " " +
         (j.reach.empty() ? std::string("-") : j.reach);
}

bool decode_decided(const std::string& line, DecidedJoiner* j) {
  const std::vector<std::string> parts = split(line, ' ');
  if (parts.size() != 4 || !parse_int(parts[0], 0, 1 << 30, &j->world) || !parse_int(parts[1], 1, 1 << 30, &j->gen) ||
      parts[2].empty() || parts[2].size() > 20 || parts[2].find_first_not_of("0123456789") != std::string::npos ||
      parts[3].empty())
    return false;
  j->host = std::stoull(parts[2]);
  j->reach = parts[3] == "-" ? "" : parts[3];
  return true;
}

uint64_t host_hash() {
  static const uint64_t hash = fnv1a(host_identity());
  return hash;
}

namespace {

// `gen` is the process's admission into the slot, as the communicator that excludes it knew it
// (comm_s::world_gens): a launcher acts on a record only for the process it runs there now, never
// on a late copy about one it already replaced. Read from the slot's count at the time of the
// record instead, a member that recorded late, after the next replacement's admission, named that
// one, and the launcher SIGKILLed it.
Status record_exclusion(Store& store, int world, int gen) {
  int64_t first = 0, n = 0;
  Status st = store.add(excluded_key(world, gen), 1, &first);
  if (st.ok() && first == 1) st = store.add(kExclusions, 1, &n);
  if (st.ok() && first == 1) st = store.set(exclusion_key(n), std::to_string(world) + " " + std::to_string(gen));
  return st;
}

}  // namespace

Status record_exclusions(comm_t c, const std::vector<int>& failed) {
  for (int r : failed) {
    const int world = c->world_ranks[static_cast<size_t>(r)];
    Status st = record_exclusion(*c->job_store, world, generation_of(c, r));
    if (!st.ok()) {
      COMM_WARN(kInit, "rank %d, comm %s: could not record the exclusion of world rank %d for the launcher: %s",
                c->rank, c->id.c_str(), world, st.message().c_str());
      return st;
    }
  }
  return Status::Ok();
}

void record_failed_joiners(Store& store, const std::string& payload) {
  // describe(): the secret, then a line per joiner (encode_decided).
  const std::vector<std::string> lines = split(payload, '\n');
  for (size_t i = 1; i < lines.size(); ++i) {
    DecidedJoiner j;
    if (!decode_decided(lines[i], &j)) continue;
    Status st = record_exclusion(store, j.world, j.gen);
    if (!st.ok()) {
      COMM_WARN(kInit, "comm_grow failed: could not record the exclusion of the joiner in world rank %d: %s", j.world,
                st.message().c_str());
      return;
    }
  }
}

}  // namespace comm::grow

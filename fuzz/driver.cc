// A main() for the fuzz targets where libFuzzer is not at hand (CI builds with the project's
// compiler, scripts/lib.sh installs no clang): replays every file of the corpus folders named
// on the command line, then feeds mutations of them (bit flips, byte changes, inserts, cuts,
// splices, with a fixed seed) for --seconds. A crash or a failed check aborts, as under
// libFuzzer; scripts/fuzz.sh runs the same targets under libFuzzer and ASan for long runs.
//   TARGET [--seconds S] [--seed N] CORPUS_DIR_OR_FILE...
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void collect(const std::string& path, std::vector<std::string>* out) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "fuzz driver: %s: not found\n", path.c_str());
    std::exit(2);
  }
  if (!S_ISDIR(st.st_mode)) {
    out->push_back(read_file(path));
    return;
  }
  DIR* dir = opendir(path.c_str());
  std::vector<std::string> names;
  while (dirent* e = dir ? readdir(dir) : nullptr)
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  if (dir) closedir(dir);
  std::sort(names.begin(), names.end());
  for (const auto& n : names) collect(path + "/" + n, out);
}

void run(const std::string& input) {
  // A copy of exactly the input's size, so that a read past its end is past an allocation.
  std::vector<uint8_t> bytes(input.begin(), input.end());
  LLVMFuzzerTestOneInput(bytes.empty() ? nullptr : bytes.data(), bytes.size());
}

std::string mutate(std::mt19937_64& rng, const std::vector<std::string>& corpus) {
  std::string s = corpus.empty() ? std::string() : corpus[rng() % corpus.size()];
  const int edits = 1 + static_cast<int>(rng() % 8);
  for (int e = 0; e < edits; ++e) {
    const size_t pos = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 7) {
      case 0:  // flip a bit
        if (!s.empty()) s[pos] = static_cast<char>(s[pos] ^ (1 << (rng() % 8)));
        break;
      case 1:  // an interesting byte
        if (!s.empty()) {
          static const char kBytes[] = {0, 1, 0x7f, static_cast<char>(0x80), static_cast<char>(0xff), '<', '>',
                                        '"', '{', '}', ':', ',', '\n', '0', '9', '-'};
          s[pos] = kBytes[rng() % sizeof kBytes];
        }
        break;
      case 2:  // insert random bytes
        s.insert(pos, std::string(1 + rng() % 8, static_cast<char>(rng())));
        break;
      case 3:  // cut
        if (!s.empty()) s.erase(pos, 1 + rng() % 16);
        break;
      case 4:  // truncate
        s.resize(pos);
        break;
      case 5:  // splice with another entry
        if (!corpus.empty()) {
          const std::string& o = corpus[rng() % corpus.size()];
          if (!o.empty()) s.insert(pos, o.substr(rng() % o.size(), 1 + rng() % 64));
        }
        break;
      default:  // an extreme 32-bit value in place
        if (s.size() >= 4) {
          const uint32_t v = rng() % 2 ? 0xffffffffu : static_cast<uint32_t>(rng());
          std::memcpy(&s[rng() % (s.size() - 3)], &v, 4);
        }
        break;
    }
  }
  if (s.size() > 64 * 1024) s.resize(64 * 1024);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2;
  uint64_t seed = 1;
  std::vector<std::string> corpus;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      collect(a, &corpus);
    }
  }
  for (const auto& c : corpus) run(c);
  std::mt19937_64 rng(seed);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t runs = 0;
  while (std::chrono::steady_clock::now() < end) {
    for (int k = 0; k < 64; ++k, ++runs) run(mutate(rng, corpus));
  }
  std::printf("%s: %zu corpus inputs and %llu mutations in %.1f s, no crash\n", argv[0], corpus.size(),
              static_cast<unsigned long long>(runs), seconds);
  return 0;
}

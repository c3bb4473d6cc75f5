// file:///PATH: a store in a directory on a filesystem every rank sees (NFS, Lustre),
// for jobs where no rank can reach rank 0 by TCP. One file per key, written to a temporary
// name and renamed into place, so a reader sees a whole value or nothing. add() serialises
// its read-modify-write with flock on a lock file in the directory.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <random>
#include <thread>

#include "store/int_value.h"
#include "store/store.h"

namespace comm {
namespace {

constexpr size_t kNameChunk = 200;  // well under NAME_MAX (255) after encoding
constexpr int kMaxPollMs = 100;
constexpr int kLockWaitMs = 60000;

// The file name for a key: bytes outside [A-Za-z0-9_-] become %XX, so no key can name
// "..", a hidden file or a path outside the directory. Long keys are split into nested
// directories; those end in '+', which the encoding never produces, so a directory can
// never have the name of a key file.
std::string key_path(const std::string& key) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string encoded;
  for (unsigned char ch : key) {
    if (std::isalnum(ch) || ch == '_' || ch == '-') {
      encoded.push_back(static_cast<char>(ch));
    } else {
      encoded.push_back('%');
      encoded.push_back(kHex[ch >> 4]);
      encoded.push_back(kHex[ch & 15]);
    }
  }
  std::string path = "k";
  for (size_t at = 0; at + kNameChunk < encoded.size(); at += kNameChunk) {
    path += encoded.substr(at, kNameChunk);
    path += "+/";
  }
  size_t tail = encoded.size() <= kNameChunk ? 0 : ((encoded.size() - 1) / kNameChunk) * kNameChunk;
  path += encoded.substr(tail);
  return path;
}

Status write_all(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return SystemError("file store: writing '" + path + "': " + errno_string(errno));
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// *found=false when the key file does not exist (yet).
Status read_file(const std::string& path, std::string* value, bool* found) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *found = false;
    if (errno == ENOENT) return Status::Ok();
    return SystemError("file store: opening '" + path + "': " + errno_string(errno));
  }
  *found = true;
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return SystemError("file store: reading '" + path + "': " + errno_string(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  *value = std::move(text);
  return Status::Ok();
}

class FileStore final : public Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {
    std::random_device rd;
    char host[64] = {};
    gethostname(host, sizeof host - 1);
    // Ranks on different hosts share the directory: the temporary name must be unique across them.
    tmp_prefix_ = dir_ + "/.tmp." + host + "." + std::to_string(getpid()) + "." + std::to_string(rd()) + ".";
  }

  using Store::set;  // the set with a deadline: this store waits on no other process
  Status set(const std::string& key, const std::string& value) override { return write_key(key, value); }

  Status get(const std::string& key, std::string* value, Deadline deadline) override {
    std::string path = dir_ + "/" + key_path(key);
    int wait_ms = 1;
    for (;;) {
      bool found = false;
      COMM_RETURN_IF_ERROR(read_file(path, value, &found));
      if (found) return Status::Ok();
      if (deadline.expired())
        return Timeout("timed out waiting for key '" + key + "' in the file store at " + dir_ +
                       ": no rank set it in time (do all ranks see this directory, with the same init_method?)");
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(wait_ms, deadline.remaining_ms(kMaxPollMs))));
      wait_ms = std::min(wait_ms * 2, kMaxPollMs);
    }
  }

  Status add(const std::string& key, int64_t delta, int64_t* result) override {
    std::string lock_path = dir_ + "/.lock";
    int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return SystemError("file store: opening '" + lock_path + "': " + errno_string(errno));
    Status st = locked_add(fd, lock_path, key, delta, result);
    ::close(fd);  // releases the flock
    return st;
  }

 private:
  Status locked_add(int fd, const std::string& lock_path, const std::string& key, int64_t delta, int64_t* result) {
    Deadline deadline = Deadline::after_ms(kLockWaitMs);
    int wait_ms = 1;
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR)
        return SystemError("file store: locking '" + lock_path + "': " + errno_string(errno));
      if (deadline.expired())
        return Timeout("file store: '" + lock_path + "' stayed locked for " + std::to_string(kLockWaitMs / 1000) +
                       " s (a process holding it hung?)");
      std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
      wait_ms = std::min(wait_ms * 2, kMaxPollMs);
    }
    std::string path = dir_ + "/" + key_path(key);
    std::string text;
    bool found = false;
    COMM_RETURN_IF_ERROR(read_file(path, &text, &found));
    int64_t current = 0;
    if (found && !parse_int64(text, &current))
      return InvalidUsage("file store add on key '" + key + "', whose value is not an integer");
    int64_t now = 0;
    if (__builtin_add_overflow(current, delta, &now))
      return InvalidArgument("file store add on key '" + key + "' overflows a 64-bit integer");
    COMM_RETURN_IF_ERROR(write_key(key, std::to_string(now)));
    *result = now;
    return Status::Ok();
  }

  Status write_key(const std::string& key, const std::string& value) {
    std::string relative = key_path(key);
    for (size_t slash = relative.find('/'); slash != std::string::npos; slash = relative.find('/', slash + 1)) {
      std::string sub = dir_ + "/" + relative.substr(0, slash);
      if (::mkdir(sub.c_str(), 0777) != 0 && errno != EEXIST)
        return SystemError("file store: creating '" + sub + "': " + errno_string(errno));
    }
    std::string path = dir_ + "/" + relative;
    std::string tmp = tmp_prefix_ + std::to_string(counter_.fetch_add(1));
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) return SystemError("file store: creating '" + tmp + "': " + errno_string(errno));
    Status st = write_all(fd, value, tmp);
    if (::close(fd) != 0 && st.ok()) st = SystemError("file store: closing '" + tmp + "': " + errno_string(errno));
    if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
      st = SystemError("file store: renaming into '" + path + "': " + errno_string(errno));
    if (!st.ok()) ::unlink(tmp.c_str());
    return st;
  }

  const std::string dir_;
  std::string tmp_prefix_;
  std::atomic<uint64_t> counter_{0};
};

Status make_dirs(const std::string& dir) {
  for (size_t slash = dir.find('/', 1); ; slash = dir.find('/', slash + 1)) {
    std::string part = slash == std::string::npos ? dir : dir.substr(0, slash);
    if (!part.empty() && ::mkdir(part.c_str(), 0777) != 0 && errno != EEXIST)
      return SystemError("file store: cannot create directory '" + part + "': " + errno_string(errno) +
                         "; init_method file:///PATH needs a directory every rank can write");
    if (slash == std::string::npos) return Status::Ok();
  }
}

}  // namespace

Status make_file_store(const std::string& dir, std::shared_ptr<Store>* out) {
  if (out == nullptr) return InvalidArgument("make_file_store: out is NULL");
  if (dir.empty() || dir[0] != '/')
    return InvalidArgument("file store directory '" + dir + "' is not an absolute path; use file:///ABSOLUTE/PATH");
  std::string clean = dir;
  while (clean.size() > 1 && clean.back() == '/') clean.pop_back();
  COMM_RETURN_IF_ERROR(make_dirs(clean));
  struct stat st {};
  if (::stat(clean.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return SystemError("file store: '" + clean + "' is not a directory; init_method file:///PATH needs one");
  if (::access(clean.c_str(), W_OK | X_OK) != 0)
    return SystemError("file store: cannot write to '" + clean + "': " + errno_string(errno) +
                       "; init_method file:///PATH needs a directory every rank can write");
  *out = std::make_shared<FileStore>(clean);
  return Status::Ok();
}

}  // namespace comm

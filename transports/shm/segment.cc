#include "shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>
#include <signal.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <utility>

#include "shm/layout.h"

namespace comm::transport::shm {

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    reset();
    name_ = std::move(other.name_);
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    fd_ = std::exchange(other.fd_, -1);
    owner_linked_ = std::exchange(other.owner_linked_, false);
  }
  return *this;
}

Segment::~Segment() { reset(); }

void Segment::reset() {
  unlink();
  if (base_ != nullptr) munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
  base_ = nullptr;
  bytes_ = 0;
  fd_ = -1;
}

void Segment::unlink() {
  if (!owner_linked_) return;
  shm_unlink(name_.c_str());
  owner_linked_ = false;
}

Status Segment::create(const std::string& name, size_t bytes, bool populate, Segment* out) {
  Segment s;
  s.name_ = name;
  s.fd_ = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (s.fd_ < 0) return SystemError("shm_open(" + name + ") failed: " + errno_string(errno));
  s.owner_linked_ = true;
  if (ftruncate(s.fd_, static_cast<off_t>(bytes)) != 0)
    return SystemError("ftruncate(" + name + ", " + std::to_string(bytes) + ") failed: " + errno_string(errno));
  // Whose it is, first: from here on a kill leaves a segment remove_orphans can attribute.
  const OwnerPrefix claim{kClaimMagic, kLayoutVersion, static_cast<int32_t>(getpid()), pid_namespace()};
  if (bytes < sizeof claim || pwrite(s.fd_, &claim, sizeof claim, 0) != static_cast<ssize_t>(sizeof claim))
    return SystemError("cannot write the owner of " + name + ": " + errno_string(errno) + " (is /dev/shm full?)");
  if (populate && fallocate(s.fd_, 0, 0, static_cast<off_t>(bytes)) != 0)
    return SystemError("cannot reserve " + std::to_string(bytes) + " bytes of shared memory for " + name + ": " +
                       errno_string(errno) + " (is /dev/shm full or too small?)");
  int flags = MAP_SHARED | (populate ? MAP_POPULATE : MAP_NORESERVE);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, s.fd_, 0);
  if (p == MAP_FAILED) return SystemError("mmap of " + name + " (" + std::to_string(bytes) + " bytes) failed: " +
                                          errno_string(errno));
  s.base_ = static_cast<char*>(p);
  s.bytes_ = bytes;
  *out = std::move(s);
  return Status::Ok();
}

Status Segment::open(const std::string& name, bool populate, Segment* out) {
  Segment s;
  s.name_ = name;
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0)
    return SystemError("shm_open(" + name + ") of a local peer failed: " + errno_string(errno) +
                       (errno == ENOENT ? " (does this rank see the same /dev/shm as its peer?)" : ""));
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    int err = errno;
    close(fd);
    return SystemError("fstat of " + name + " failed or it is empty: " + errno_string(err));
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  int flags = MAP_SHARED | (populate ? MAP_POPULATE : MAP_NORESERVE);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
  int err = errno;
  close(fd);  // the mapping keeps the memory
  if (p == MAP_FAILED)
    return SystemError("mmap of a local peer's " + name + " (" + std::to_string(bytes) + " bytes) failed: " +
                       errno_string(err));
  s.base_ = static_cast<char*>(p);
  s.bytes_ = bytes;
  *out = std::move(s);
  return Status::Ok();
}

std::string segment_name(const std::string& secret, const std::string& comm_id, int rank, char kind) {
  std::string name = "/comm-" + secret.substr(0, 16) + "-" + comm_id + "-" + std::to_string(rank);
  name.push_back(kind);
  for (size_t i = 1; i < name.size(); ++i)
    if (name[i] == '/') name[i] = '_';
  return name;
}

uint64_t pid_namespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

int remove_orphans(std::chrono::seconds unclaimed_age) {
  const uint64_t my_ns = pid_namespace();
  const time_t now = time(nullptr);
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr || my_ns == 0) {
    if (dir != nullptr) closedir(dir);
    return 0;
  }
  int removed = 0;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind("comm-", 0) != 0) continue;
    const int fd = shm_open(("/" + name).c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) continue;
    OwnerPrefix owner{};
    const bool read_all = pread(fd, &owner, sizeof owner, 0) == static_cast<ssize_t>(sizeof owner);
    struct stat st {};
    const bool aged = fstat(fd, &st) == 0 && now - st.st_mtime >= static_cast<time_t>(unclaimed_age.count());
    close(fd);
    if (!read_all || (owner.magic != kControlMagic && owner.magic != kArenaMagic && owner.magic != kClaimMagic)) {
      // No owner written: its creator died between shm_open and writing its claim (a few
      // instructions), or this is not a libcomm segment at all; only an old one is removed.
      if (aged && shm_unlink(("/" + name).c_str()) == 0) ++removed;
      continue;
    }
    if (owner.pid_ns != my_ns || owner.pid <= 0) continue;
    if (kill(owner.pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

}  // namespace comm::transport::shm

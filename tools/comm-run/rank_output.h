// A rank's output as comm-run passes it on: each pipe (stdout, stderr) reassembled into whole
// lines, each line prefixed with "[rank] " and written in one write, so lines of different
// ranks never mix.
#pragma once

#include <cstddef>
#include <string>

namespace comm_run {

// A line longer than this is passed on in parts (the first with the prefix).
constexpr size_t kMaxPartialLine = 64 * 1024;

// Writes everything, retrying on EINTR; drops the output when our own stdout is gone.
void write_all(int fd, const char* data, size_t len);

// One pipe from a rank (its stdout or its stderr), reassembled into whole lines.
struct Stream {
  int fd = -1;
  int dest = -1;
  std::string pending;     // bytes after the last newline
  bool mid_line = false;   // a long line was already emitted in part, with its prefix

  // Emits every complete line, prefixed, in one write so lines of different ranks never mix.
  void emit(const std::string& prefix, bool at_eof);

  // Reads what is there. Returns false at end of file (or error): the stream is closed.
  bool pump(const std::string& prefix);

  // At the end of the job: passes on what is in the pipe, without waiting for end of file
  // (a process a rank left behind may hold the pipe open), and closes it.
  void drain(const std::string& prefix);
};

}  // namespace comm_run

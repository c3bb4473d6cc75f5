// comm-bench --device 1: CUDA managed buffers (the engine fills and checks them from the host; the
// GPU migrates them on first use) and one CUDA stream, through the CUDA runtime libcomm itself
// opens with dlopen. Without the CUDA headers at build time, open() says so.
#pragma once

#include <cstddef>
#include <string>

namespace bench {

class DeviceStream {
 public:
  ~DeviceStream();
  // "" on success, else why not. default_stream (-y 1): the legacy default stream, not a new one.
  std::string open(bool default_stream = false);
  void* stream() const { return stream_; }
  void* alloc(size_t bytes, std::string* error);
  void release(void* p);
  bool copy(void* dst, const void* src, size_t bytes, std::string* error);  // on the stream, any memory
  bool sync(std::string* error);  // the stream's work done (bounded by the work itself)

 private:
  void* stream_ = nullptr;
  bool open_ = false;
  bool owned_ = false;  // created by open(), so destroyed here
};

}  // namespace bench

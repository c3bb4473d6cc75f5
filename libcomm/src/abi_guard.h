// The one place where an internal Status becomes a comm_status_t: records the calling
// thread's last error and keeps C++ exceptions from crossing the C ABI.
#pragma once

#include <exception>
#include <new>

#include "comm/comm.h"
#include "log.h"
#include "status.h"

namespace comm {

void set_last_error(const Status& st);

template <typename F>
comm_status_t guarded(const char* what, F&& body) {
  Status st;
  try {
    st = body();
  } catch (const std::bad_alloc&) {
    st = SystemError(std::string(what) + ": out of memory");
  } catch (const std::exception& e) {
    st = Internal(std::string(what) + ": unexpected exception: " + e.what());
  } catch (...) {
    st = Internal(std::string(what) + ": unexpected exception");
  }
  if (!st.ok()) set_last_error(st);
  return st.code();
}

}  // namespace comm

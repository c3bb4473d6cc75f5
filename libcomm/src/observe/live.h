// The communicators alive in this process, for the metrics plugin's scrapes (observe/snapshot.cc)
// and its start at the first one (observe/metrics.cc). A scrape holds the registry's lock while
// it reads; comm_destroy takes a communicator out under the same lock before it frees anything.
#pragma once

#include <functional>

#include "communicator.h"

namespace comm::observe {

// comm_init and every child, once connected; and comm_destroy, first.
void attach(comm_t c);
void detach(comm_t c);
// fn(c) for every live communicator, in the order they came, under the registry's lock.
void for_each_live(const std::function<void(comm_t)>& fn);

}  // namespace comm::observe

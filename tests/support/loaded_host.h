// How much a busy machine may add to anything a test times. CI runs beside other jobs on two
// cores (two busy loops and a process-spawning job, issue 25): a thread or a process there can
// wait seconds for a core. So a test never asserts a duration or an order the scheduler decides;
// an upper bound only tells "ended by the deadline (or the event) it waited for" from "hung" or
// "waited for something else", and is the awaited deadline plus this margin, never a tight
// multiple of it. A bound that must stay below a deadline (an error seen "at once, not at the
// timeout") gets a timeout far above the margin instead. Lower bounds (a deadline was honoured)
// need no margin: the scheduler only makes things later.
#pragma once

namespace loaded_host {

constexpr int kSlackMs = 20000;
constexpr double kSlackS = kSlackMs / 1000.0;

}  // namespace loaded_host

#ifndef CKPTD_BASE_STOP_SIGNALS_H_
#define CKPTD_BASE_STOP_SIGNALS_H_

#include <csignal>

namespace ckptd::base {

// The daemons stop on SIGINT or SIGTERM, taken by sigwait() in main().
// BlockStopSignals() blocks both in the calling thread and must be called
// before any thread starts, so that every thread inherits the mask: a stop
// signal then stays pending until WaitForStopSignal() takes it, whichever
// thread the kernel would have delivered it to. (A handler that sets a flag
// for a main thread in pause() loses the race when the signal lands on
// another thread: pause() never returns.) Children started later inherit the
// mask too; a daemon that starts any unblocks the signals in the child.
sigset_t BlockStopSignals();

// Waits for SIGINT or SIGTERM (as blocked by BlockStopSignals) and returns
// its number.
int WaitForStopSignal(const sigset_t& stop_signals);

}  // namespace ckptd::base

#endif  // CKPTD_BASE_STOP_SIGNALS_H_

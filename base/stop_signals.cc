#include "base/stop_signals.h"

#include <pthread.h>

namespace ckptd::base {

sigset_t BlockStopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

int WaitForStopSignal(const sigset_t& stop_signals) {
  int sig = 0;
  // sigwait fails only for an invalid set; it is not interrupted (EINTR).
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  return sig;
}

}  // namespace ckptd::base

#include "resilience/stop_signal.h"

#include <signal.h>

#include <atomic>
#include <csignal>

namespace vidit {
namespace {

volatile std::sig_atomic_t g_signal = 0;
std::atomic<bool> g_stop{false};

void on_signal(int sig) {
  if (sig == SIGINT && g_stop.load()) {
    std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C: stop now
    std::raise(SIGINT);
    return;
  }
  g_signal = sig;
  g_stop.store(true);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // collectives and file writes in progress carry on
  for (int sig : {SIGTERM, SIGUSR1, SIGINT}) sigaction(sig, &sa, nullptr);
}

bool stop_requested() { return g_stop.load(); }

void request_stop() { g_stop.store(true); }

int stop_signal() { return int(g_signal); }

}  // namespace vidit

#include "resilience/stop_signal.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <string>

namespace vidit {
namespace {

volatile std::sig_atomic_t g_signal = 0;
std::atomic<bool> g_stop{false};
char g_marker[1024] = {0};  // set_signal_marker()

// The marker file, written with async-signal-safe calls only.
void write_marker(int sig) {
  if (g_marker[0] == 0) return;
  const int fd = ::open(g_marker, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  char digits[4] = {char('0' + sig / 10 % 10), char('0' + sig % 10), '\n', 0};
  ssize_t ignored = ::write(fd, digits, 3);
  (void)ignored;
  ::close(fd);
}

void on_signal(int sig) {
  if (sig == SIGINT && g_stop.load()) {
    std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C: stop now
    std::raise(SIGINT);
    return;
  }
  g_signal = sig;
  g_stop.store(true);
  write_marker(sig);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // collectives and file writes in progress carry on
  for (int sig : {SIGTERM, SIGUSR1, SIGINT}) sigaction(sig, &sa, nullptr);
  // A peer that died (its sockets closed) is an error of the collective that wrote to it
  // (EPIPE), not this process killed by SIGPIPE: the launcher then names the rank that failed
  // first, not the survivor that wrote to it.
  std::signal(SIGPIPE, SIG_IGN);
}

bool stop_requested() { return g_stop.load(); }

void request_stop() { g_stop.store(true); }

int stop_signal() { return int(g_signal); }

void set_signal_marker(const std::string& path) {
  if (path.size() >= sizeof g_marker) return;
  std::memcpy(g_marker, path.c_str(), path.size() + 1);
}

}  // namespace vidit

// Stopping on request: SIGTERM (Slurm preemption, `scancel`, a spot reclaim, torchrun's agent),
// SIGUSR1 (Slurm's `--signal=USR1@<seconds>` before the time limit) and SIGINT (Ctrl-C) only set
// a flag; the trainer looks at it after every step (agreed by all ranks), saves a checkpoint and
// returns, and `vidit train` exits with kRestartStatus: "stopped cleanly, restart me". A second
// SIGINT ends the process at once. SIGPIPE is ignored (a dead peer is the collective's error).
#pragma once
#include <string>

namespace vidit {

// The exit status of a run stopped by a signal after saving (EX_TEMPFAIL of sysexits.h).
inline constexpr int kRestartStatus = 75;

void install_stop_handlers();
bool stop_requested();
// What the handlers do (and fault injection, to stop a run as a scheduler would).
void request_stop();
// The signal that asked, or 0.
int stop_signal();
// Where the handler also writes the signal's number, at once (a launcher that ends a job sends
// SIGTERM and soon SIGKILL): the watchdog's heartbeat directory (diagnose/crashes.h).
void set_signal_marker(const std::string& path);

}  // namespace vidit

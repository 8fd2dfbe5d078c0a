// Ranks that died without a word, found by the next attempt, and hosts that keep doing it.
//
// Each rank's watchdog leaves a heartbeat file (resilience/watchdog.h) that says at the end how
// the process ended: by its own hand ("exited": a return or an error; "watchdog"), or that it
// received a stop signal (a launcher ending the job sends SIGTERM to the ranks still alive). A
// rank killed outright (SIGKILL, the OOM killer, a segfault, a node that lost power) leaves
// neither. (The stop signal's handler also writes <dir>/rank_NNNNN.signal itself, at once, in
// case the launcher's SIGKILL comes before the next heartbeat.) When a job fails and restarts, rank 0 of the new attempt reads the heartbeats before
// they are replaced: the ranks that left neither, while some other rank did leave one, are the
// ones that died first. When every rank is silent (srun with PMIx SIGKILLs a step's other tasks
// about a second after one dies; the whole job killed at once), the ones that died first are
// those whose last heartbeat is both older, by kSilentGapMs, and behind in collectives entered,
// than the newest, when a rank that entered the most was waiting in a collective at its last
// heartbeat: the others went on, entered the collective the dead rank never reached, and
// waited in it (a wait of watchdog.h's kBlockedBeatS gets a heartbeat at once, so one lands
// after the dead rank's last even when the launcher kills the rest within half a second). When
// no rank stands out so, none is blamed: a rank that is only late looks the same, and a job
// killed whole while every rank was computing blames no one. Each is recorded as a "crashed" event with its host; a host that crashed
// `after` attempts goes to the exclude list (diagnose/health.h add_to_exclude_list). The
// heartbeats read are moved to <dir>.previous, so no attempt counts them twice.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "diagnose/events.h"

namespace vidit {

inline constexpr int64_t kSilentGapMs = 150;

struct DeadRank {
  int rank = 0;
  std::string host, phase;
  int64_t step = 0;
};

// The ranks of the attempt whose heartbeats are in `dir` that died without a word; `rank_hosts`:
// that attempt's ranks (a rank without a heartbeat died before it began to train).
std::vector<DeadRank> ranks_that_died(const std::string& dir, const std::vector<std::string>& rank_hosts);

// Rank 0 at the start of an attempt: records the dead ranks of the attempt before (events
// "crashed"), and adds each host that has now crashed `after` attempts (0: never) to
// `exclude_file`; moves the heartbeats aside. Returns the hosts added.
std::vector<std::string> note_crashes(const std::string& out_dir, EventLog& events, int64_t step, int64_t after,
                                      const std::string& exclude_file);

}  // namespace vidit

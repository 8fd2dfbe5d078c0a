// The control protocol of a training run: every collective the run makes besides the model's
// own (the parallelisms' gathers, reductions and exchanges inside forward and backward, which
// parallelize() owns), named here with when each rank makes it. Every rank of the world makes
// these in the same order; a rank that skips one (say, behind `if (is_lead())`) hangs the job.
//
// Construction (Trainer::Trainer)
//   hosts            all-gather (world) of each rank's host name: gather_hosts (diagnose/rank_hosts.h)
//   recompute plan   all-reduce max (world) of the measured block activations, with
//                    train.memory_budget_gb only
//   snapshot buffers all-gather (dp) of the ranks' random streams, when batches are the ranks'
//                    own (Checkpointer::reserve -> checkpoint_state)
// Each step (Trainer::step, train_step.cpp)
//   batch shares     all-reduce sum (dp) of each rank's samples per micro-batch, when batches
//                    are the ranks' own (batch_share)
//   totals           all-reduce sum (dp) of the loss, samples, tokens and FLOPs
//   gradient norm    the global norm's all-reduces (ParallelModel::clip_grad_norm)
//   spikes           all-reduce max and all-gathers (dp) of every sample's loss and sigma, and a
//                    forward re-run on every rank, with train.spike_action != "off"
//                    (spike_response.cpp); a spike there may ask for a rollback, which the
//                    agreement below decides
// After each step (Trainer::fit), in this order
//   slowest rank     all-gather (world) of each rank's busy time, on logged steps (find_slowest)
//   replicas         all-gather (world) of the replicas' fingerprints, every
//                    train.replica_check_every steps and before each save (diagnose/replica_check.h)
//   agreement        agree_after_step below: one all-reduce (world); a rollback it decides runs
//                    the resume below at once (the rolled-back step's metrics line is dropped
//                    when the sinks reopen at the step returned to)
//   saves            Checkpointer::start_save / finish_oldest (checkpoint/checkpointer.h), as the
//                    agreement said
// Resume and rollback: Checkpointer::resume (checkpoint/checkpointer.h).
// End of fit(): the last save, and summarize_communication (run_summary.cpp).
#pragma once

namespace vidit {

class Comm;

// This rank's view after a step.
struct AfterStepView {
  bool stop_requested = false;  // a signal reached this rank (resilience/stop_signal.h)
  bool save_time_due = false;   // rank 0's clock: checkpoint.every_minutes have passed
  bool writing = false;         // this rank's writer is still writing a save
  bool rollback_asked = false;  // the step's spike asks to return to the newest checkpoint
};

// What every rank does next, the same on all.
struct AfterStepDecision {
  bool stop = false;           // some rank was asked to stop: save, then return
  bool save_due = false;       // by the clock (rank 0's)
  bool saves_written = false;  // no rank is writing: the saves in flight are finished now
  bool roll_back = false;      // some rank's spike response asks for it: every rank resumes
};

// One all-reduce (max) over `world` of every rank's view; every rank calls it after each step.
AfterStepDecision agree_after_step(Comm& world, const AfterStepView& mine);

}  // namespace vidit

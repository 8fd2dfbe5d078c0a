#include "train/run_control.h"

#include <ATen/ATen.h>

#include "parallel/comm.h"

namespace vidit {

AfterStepDecision agree_after_step(Comm& world, const AfterStepView& mine) {
  at::Tensor flags = at::tensor({mine.stop_requested ? 1.0 : 0.0, mine.save_time_due ? 1.0 : 0.0,
                                 mine.writing ? 1.0 : 0.0, mine.rollback_asked ? 1.0 : 0.0},
                                at::kDouble);
  world.all_reduce(flags, ReduceOp::Max)->wait();
  AfterStepDecision d;
  d.stop = flags[0].item<double>() > 0;
  d.save_due = flags[1].item<double>() > 0;
  d.saves_written = flags[2].item<double>() == 0;
  d.roll_back = flags[3].item<double>() > 0;
  return d;
}

}  // namespace vidit

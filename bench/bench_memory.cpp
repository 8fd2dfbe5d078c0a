// Each rank's peak resident memory in each phase of a training run, side by side with what
// `vidit plan` predicts for that phase (parallel/plan.h). Run under mpirun for a mesh:
//   mpirun -np N bench_memory [--config F] [--set k=v ...] [--steps N] [--out DIR]
// Phases, each measured as the process's peak resident set (VmHWM) since the phase began (Linux
// resets it when 5 is written to /proc/self/clear_refs):
//   runtime       the process with its communicator and mesh, before the model;
//   construction  the Trainer: the model built without storage, parallelized, this rank's parts
//                 filled; AdamW, EMA and the checkpoint snapshot buffers;
//   step          --steps optimizer steps;
//   save          one checkpoint, written and committed;
//   resume        a second Trainer (in a fresh process: --resume) reading that checkpoint.
// Rank 0 prints one row per rank and phase: measured, planned, and their ratio.
#include <CLI/CLI.hpp>

#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/config.h"
#include "core/error.h"
#include "core/malloc_tuning.h"
#include "loader/dataset.h"
#include "parallel/comm.h"
#include "parallel/launch_env.h"
#include "parallel/mesh.h"
#include "parallel/plan.h"
#include "train/trainer.h"

using namespace vidit;

namespace {

double status_kib(const char* field) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::string(field).size()));
  return -1;
}

void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }
double peak_bytes() { return status_kib("VmHWM:") * 1024; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"each rank's peak memory per phase against vidit plan"};
  std::string config, out = "/tmp/vidit_bench_memory";
  std::vector<std::string> sets;
  int steps = 2;
  bool resume = false;
  app.add_option("-c,--config", config);
  app.add_option("--set", sets);
  app.add_option("--steps", steps);
  app.add_option("--out", out, "the run's folder (its checkpoint is what --resume reads)");
  app.add_flag("--resume", resume, "build the trainer and resume from --out's checkpoint (run after a run without it)");
  bool system_malloc = false;
  app.add_flag("--system-malloc", system_malloc, "leave glibc's malloc settings as they are (vidit train tunes them)");
  CLI11_PARSE(app, argc, argv);
  if (!system_malloc) keep_freed_memory();  // as `vidit train` does
  try {
    sets.insert(sets.begin(), {"data.source=synthetic", "checkpoint.every=0", "train.log_every=1000",
                               "train.tensorboard=false"});
    sets.push_back("train.out_dir=\"" + out + "\"");
    Config cfg = load_config(config, sets);
    auto world = make_world_comm(detect_launch_env());
    auto mesh = std::make_shared<Mesh>(cfg, world);
    auto data = std::make_shared<SyntheticDataset>(cfg, 64, cfg.train.seed);
    const at::Tensor null_text = at::zeros({cfg.model.text_len, cfg.model.text_dim});
    const StepPlan plan = plan_step(cfg);
    struct Row {
      const char* phase;
      double measured, planned;
    };
    std::vector<Row> rows;
    const bool verbose = std::getenv("BENCH_MEMORY_VERBOSE") != nullptr;
    auto done = [&](const char* phase, double measured, double planned) {
      rows.push_back({phase, measured, planned});
      if (verbose) {  // as it happens, every rank (a phase that does not fit is seen before the kill)
        // And where the resident memory is now: anonymous vs file pages, and the heap glibc holds
        // (in use vs free but kept).
        const struct mallinfo2 mi = mallinfo2();
        std::fprintf(stderr, "rank %d %-13s peak %6.0f MiB (now %6.0f MiB: anon %6.0f, file %5.0f; heap %6.0f in use, "
                     "%6.0f free kept, %6.0f mmapped), planned %6.0f MiB\n", world->rank(), phase,
                     measured / (1 << 20), status_kib("VmRSS:") / 1024, status_kib("RssAnon:") / 1024,
                     status_kib("RssFile:") / 1024, double(mi.uordblks) / (1 << 20), double(mi.fordblks) / (1 << 20),
                     double(mi.hblkhd) / (1 << 20), planned / (1 << 20));
      }
    };
    done("runtime", status_kib("VmRSS:") * 1024, plan.runtime);
    reset_peak();
    Trainer t(cfg, data, null_text, at::kCPU, mesh);
    world->barrier();
    done("construction", peak_bytes(), plan.construction_peak());
    if (resume) {
      reset_peak();
      VIDIT_CHECK(t.resume(), "bench_memory --resume: no checkpoint under ", out, " (run once without --resume first)");
      world->barrier();
      done("resume", peak_bytes(), plan.resume_peak());
    } else {
      reset_peak();
      for (int i = 0; i < steps; ++i) t.step();
      world->barrier();
      done("step", peak_bytes(), plan.step_peak());
      reset_peak();
      t.save();
      world->barrier();
      done("save", peak_bytes(), plan.step_peak());
    }
    // Rank 0 prints every rank's rows.
    at::Tensor mine = at::empty({int64_t(rows.size()) * 2}, at::kDouble);
    for (size_t i = 0; i < rows.size(); ++i) mine[2 * i] = rows[i].measured, mine[2 * i + 1] = rows[i].planned;
    at::Tensor all = at::empty({world->size() * mine.numel()}, at::kDouble);
    world->all_gather(mine, all)->wait();
    if (world->rank() == 0) {
      std::printf("bench_memory: %d ranks, %lld parameters, mesh shard %lld tensor %lld replicate %lld, %lld snapshot sets\n",
                  world->size(), (long long)plan.params, (long long)cfg.parallel.shard, (long long)cfg.parallel.tensor,
                  (long long)cfg.parallel.replicate, (long long)cfg.checkpoint.snapshots);
      std::printf("%-5s %-13s %12s %12s %8s\n", "rank", "phase", "measured", "planned", "ratio");
      all = all.view({world->size(), int64_t(rows.size()), 2});
      for (int r = 0; r < world->size(); ++r)
        for (size_t i = 0; i < rows.size(); ++i) {
          const double m = all[r][i][0].item<double>(), p = all[r][i][1].item<double>();
          std::printf("%-5d %-13s %9.0f MiB %9.0f MiB %8.3f\n", r, rows[i].phase, m / (1 << 20), p / (1 << 20), m / p);
        }
    }
    world->barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_memory: %s\n", e.what());
    return 1;
  }
  return 0;
}

// `vidit`: one binary, subcommands train | sample | info | plan | demo | prepare | encode-text. Every subcommand
// takes --config FILE (TOML; defaults are the embedded demo) and repeated --set section.key=value.
#include <torch/cuda.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <sstream>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>
#include <set>
#include <tuple>

#include "core/config.h"
#include "core/device_memory.h"
#include "core/error.h"
#include "core/gpu_events.h"
#include "core/malloc_tuning.h"
#include "core/peak_flops.h"
#include "core/safetensors.h"
#include "loader/cache_loader.h"
#include "loader/dataset.h"
#include "prepare/frame_encoder.h"
#include "loader/latent_cache.h"
#include "prepare/prepare.h"
#include "video/video_decoder.h"
#include "demo/demo.h"
#include "prepare/caption_embedder.h"
#include "prepare/demo_codec.h"
#include "demo/demo_data.h"
#include "parallel/comm.h"
#include "parallel/launch_env.h"
#include "parallel/mesh.h"
#include "diagnose/crashes.h"
#include "diagnose/doctor.h"
#include "diagnose/health.h"
#include "pipeline/sampling_ranks.h"
#include "text/umt5.h"
#include "pipeline/training_samples.h"
#include "diagnose/rank_hosts.h"
#include "diagnose/replica_check.h"
#include "resilience/fault_injection.h"
#include "resilience/run_lock.h"
#include "resilience/stop_signal.h"
#include "text/text_encoder.h"
#include "pipeline/wan_pipeline.h"
#include "pipeline/image_condition.h"
#include "pipeline/pipeline_export.h"
#include "pipeline/release_sampling.h"
#include "vision/image_file.h"
#include "pipeline/sample_memory.h"
#include "prepare/caption_store.h"
#include "prepare/manifest.h"
#include "model/weight_layout.h"
#include "parallel/plan.h"
#include "parallel/step_time.h"
#include "model/model_info.h"
#include "model/state_dict.h"
#include "model/lora.h"
#include "checkpoint/checkpoint.h"
#include "train/cost_calibration.h"
#include "train/run_weights.h"
#include "train/trainer.h"
#include "diffusion/frame_condition.h"
#include "vae/wan22_vae.h"
#include "vae/wan_vae.h"

using namespace vidit;

namespace {

struct CommonOpts {
  std::string config;
  std::vector<std::string> sets;
};

void add_common(CLI::App* app, CommonOpts& o) {
  app->add_option("-c,--config", o.config, "TOML config (configs/*.toml); default: the embedded demo");
  app->add_option("--set", o.sets, "override a key: --set train.lr=3e-4 (repeatable)");
}

int cmd_info(const CommonOpts& o) {
  Config cfg = load_config(o.config, o.sets);
  std::printf("%s", format_info(cfg, model_info(cfg)).c_str());
  return 0;
}

// --rates matmul=T,attention=T,peak=T (TFLOP/s),memory=G,link=G (GB/s): any of them.
DeviceRates parse_rates(const std::string& text) {
  DeviceRates r;
  r.source = "given (--rates)";
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t eq = item.find('=');
    VIDIT_CHECK(eq != std::string::npos, "plan --rates: '", item, "' is not name=value (names: matmul, attention, "
                "peak in TFLOP/s; memory, link in GB/s)");
    const std::string name = item.substr(0, eq);
    double v = 0;
    try {
      v = std::stod(item.substr(eq + 1));
    } catch (const std::exception&) {
      fail("plan --rates: '", item, "' has no number after '='");
    }
    if (name == "matmul") r.matmul_flops = v * 1e12;
    else if (name == "attention") r.attention_flops = v * 1e12;
    else if (name == "peak") r.peak_flops = v * 1e12;
    else if (name == "memory") r.memory_bytes = v * 1e9;
    else if (name == "link") r.link_bytes = v * 1e9;
    else fail("plan --rates: unknown rate '", name, "' (matmul, attention, peak in TFLOP/s; memory, link in GB/s)");
  }
  return r;
}

int cmd_plan(const CommonOpts& o, int64_t world, double gpu_gib, const std::string& measure, const std::string& rates,
             const std::string& sample = "", const std::string& sample_on = "cuda") {
  Config cfg = load_config(o.config, o.sets);
  std::printf("%s", format_info(cfg, model_info(cfg)).c_str());
  if (!sample.empty()) {  // the peak memory of `vidit sample` at FRAMESxWIDTHxHEIGHT (pipeline/sample_memory.h)
    VideoRequest r;
    char x1 = 0, x2 = 0, rest = 0;
    long long f = 0, w = 0, h = 0;
    VIDIT_CHECK(std::sscanf(sample.c_str(), "%lld%c%lld%c%lld%c", &f, &x1, &w, &x2, &h, &rest) == 5 && x1 == 'x' && x2 == 'x',
                "plan --sample '", sample, "': give FRAMESxWIDTHxHEIGHT, e.g. 81x832x480");
    r.frames = f, r.width = w, r.height = h;
    const SampleMemoryInputs in = sample_memory_inputs(cfg, r, sample_on == "cpu" ? at::Device(at::kCPU) : at::Device(at::kCUDA),
                                                       world > 0 ? int(world) : 1,
                                                       cfg.data.codec == Codec::wan22_vae ? 16 : 8);  // the VAE's stride
    const SampleMemory m = predict_sample_memory(in);
    std::printf("%s", format_sample_memory(in, m).c_str());
    if (gpu_gib > 0) {  // --gpu-memory: does the busiest phase fit each rank's device?
      const double need = double(m.peak) / double(1ull << 30);
      if (need <= gpu_gib) {
        std::printf("  fits %.0f GiB per device (%.2f GiB needed, by %s)\n", gpu_gib, need, m.peak_phase.c_str());
      } else {
        std::printf("  does NOT fit %.0f GiB per device: %s needs %.2f GiB; set sample.dtype = \"bf16\", or sample "
                    "on more ranks (--world N: the tokens split, parallel.shard to shard the weights)\n",
                    gpu_gib, m.peak_phase.c_str(), need);
        return 1;
      }
    }
    return 0;
  }
  if (world <= 0) {
    const auto& p = cfg.parallel;
    validate_mesh(cfg, int(p.replicate * p.shard * p.ulysses * p.ring * p.tensor));
    // With --measure, the activations are also what a block holds on that device.
    std::optional<BlockActivations> activations;
    if (!measure.empty()) {
      VIDIT_CHECK(measure == "cpu" || measure == "cuda", "plan --measure: the device is 'cpu' or 'cuda', not '", measure, "'");
      activations = measure_block_activations(cfg, measure == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU));
    }
    const StepPlan plan = plan_step(cfg, activations ? &*activations : nullptr);
    std::printf("%s", format_plan(cfg, plan).c_str());
    if (activations)
      std::printf("a block holds   %.1f KiB per token (selective %.1f, whole %.1f) and %.1f KiB per sample, %s\n",
                  activations->keep.per_token / 1024, activations->selective.per_token / 1024,
                  activations->whole.per_token / 1024, activations->keep.per_sample / 1024, activations->source.c_str());
    if (!measure.empty() || !rates.empty()) {
      // Measured rates, with any given ones (the link, which one process cannot measure) on top.
      DeviceRates r = measure.empty() ? DeviceRates{} : measure_rates(cfg, measure);
      if (!rates.empty()) {
        const DeviceRates given = parse_rates(rates);
        for (auto [mine, theirs] : {std::pair{&r.matmul_flops, given.matmul_flops}, {&r.attention_flops, given.attention_flops},
                                    {&r.memory_bytes, given.memory_bytes}, {&r.link_bytes, given.link_bytes},
                                    {&r.peak_flops, given.peak_flops}})
          if (theirs > 0) *mine = theirs;
        r.source = measure.empty() ? given.source : r.source + " and given (--rates)";
      }
      std::printf("%s", format_step_time(predict_step_time(cfg, plan, r), r).c_str());
    }
    return 0;
  }
  const double gpu_bytes = gpu_gib * double(1ull << 30);
  std::printf("%s", format_meshes(cfg, plan_meshes(cfg, world, gpu_bytes), gpu_bytes).c_str());
  return 0;
}

// train.device: the GPU of this process's local rank when asked for, or (auto) when one is present.
at::Device train_device(const Config& cfg, const LaunchEnv& env) {
  const DeviceChoice want = cfg.train.device;
  if (want == DeviceChoice::cpu || (want == DeviceChoice::automatic && !torch::cuda::is_available())) return at::kCPU;
  VIDIT_CHECK(torch::cuda::is_available(), "train.device = \"cuda\" but this torch sees no GPU (a CPU build, or no "
              "driver); set train.device = \"cpu\" or build against a CUDA torch");
  const int64_t gpus = int64_t(torch::cuda::device_count());
  VIDIT_CHECK(env.local_rank < gpus || gpus == 1, "rank ", env.rank, " has local rank ", env.local_rank,
              " but this node shows it ", gpus, " GPUs; start one process per GPU (or make one GPU visible to each)");
  const int gpu = process_gpu(env, int(gpus));
  use_gpu(gpu);  // before the process group and the model touch CUDA
  return at::Device(at::kCUDA, int8_t(gpu));
}

// The pre-flight checks (diagnose/health.h) over every rank of `world`; rank 0 prints the table
// and adds the unhealthy hosts to the exclude list (default <out_dir>/exclude_hosts.txt).
HealthReport preflight(const Config& cfg, Comm& world, const at::Device& device, std::string exclude_file,
                       const std::vector<std::string>& checks = {"device", "network", "storage"}) {
  const std::vector<std::string> hosts = gather_hosts(world);
  HealthOptions h;
  const std::set<std::string> which(checks.begin(), checks.end());
  h.check_device = which.count("device") > 0, h.check_network = which.count("network") > 0;
  h.check_storage = which.count("storage") > 0;
  h.device = device;
  h.threshold = cfg.train.straggler_threshold;
  h.out_dir = cfg.train.out_dir;
  h.min_free_gb = 1.1 * 4 * 4 * double(model_info(cfg).params) / 1e9;  // a checkpoint: weights, EMA, AdamW
  if (device.is_cuda()) h.expected_tflops = peak_tflops(cuda_device_name(device.index()), Precision::bf16);
  h.slow_s = FaultInjector(cfg.faults, world.rank()).slowdown_s();
  Progress::Options progress;  // rank 0: an updating line on a terminal, else a line every VIDIT_PROGRESS_SECONDS
  h.progress = &progress;
  HealthReport r = run_health(world, hosts, h);
  if (world.rank() == 0) {
    std::printf("vidit health: %d rank(s) on %zu host(s), %s\n%s", world.size(),
                std::set<std::string>(hosts.begin(), hosts.end()).size(), device.str().c_str(), r.table.c_str());
    if (exclude_file.empty()) exclude_file = exclude_list_path(cfg.train);
    for (const auto& link : r.slow_links)
      std::printf("slow link: %s (their all-reduce is below %.0f%% of the median pair, while each host is fine with "
                  "its other neighbour): check the cables, ports or switch between them\n",
                  link.c_str(), 100 * h.threshold);
    if (r.healthy()) {
      std::printf("every host is healthy\n");
    } else if (r.bad_hosts.empty()) {
      std::printf("unhealthy: the network is slow (see the all-reduce over all ranks); no host to exclude\n");
    } else {
      const auto all = add_to_exclude_list(exclude_file, r.bad_hosts);
      std::string names;
      for (const auto& x : r.bad_hosts) names += (names.empty() ? "" : ",") + x;
      std::printf("unhealthy: %s; %zu host(s) now in %s (srun / sbatch --exclude=$(paste -sd, %s))\n", names.c_str(),
                  all.size(), exclude_file.c_str(), exclude_file.c_str());
    }
  }
  world.barrier();
  return r;
}

// vidit health: exit 3 when a host is unhealthy or the network is slow.
int cmd_health(const CommonOpts& o, const std::string& exclude_file, const std::vector<std::string>& checks) {
  Config cfg = load_config(o.config, o.sets);
  const LaunchEnv env = detect_launch_env();
  const at::Device device = train_device(cfg, env);
  if (cfg.train.threads > 0) at::set_num_threads(int(cfg.train.threads));
  std::shared_ptr<Comm> world = make_world_comm(env, device.type());
  return preflight(cfg, *world, device, exclude_file, checks).healthy() ? 0 : kUnhealthyStatus;
}

// --fresh: what an earlier run left in out_dir (checkpoints, metrics, the cost model) is moved, not
// deleted, to <out_dir>/previous-<UTC time>/.
void set_aside_previous_run(const std::string& out_dir) {
  namespace fs = std::filesystem;
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "previous-%Y%m%d-%H%M%S", std::gmtime(&now));
  const fs::path aside = fs::path(out_dir) / stamp;
  for (const char* name : {"checkpoints", "metrics.jsonl", "saves.jsonl", "events.jsonl", "tb", "forensics", "quarantine.json",
                           "heartbeats", "heartbeats.previous", "cost_model.json"}) {
    if (!fs::exists(fs::path(out_dir) / name)) continue;
    fs::create_directories(aside);
    fs::rename(fs::path(out_dir) / name, aside / name);
  }
  if (fs::exists(aside)) std::printf("--fresh: the earlier run's checkpoints and metrics are now in %s\n", aside.c_str());
}

int cmd_train(const CommonOpts& o, bool fresh, int64_t max_steps) {
  Config cfg = load_config(o.config, o.sets);
  // Two experts train one at a time, each on its own noise levels (model/experts.h).
  VIDIT_CHECK(cfg.model.boundary == 0 || cfg.train.expert != Expert::none, cfg.source, ": model.boundary = ",
              cfg.model.boundary, " splits the model into two experts; set train.expert = \"high\" or \"low\" to "
              "train one of them (a run of both at once would train one model on every noise level)");
  // Distributed: the launcher's environment says who we are; a mesh that cannot fit is refused
  // before MPI starts.
  const LaunchEnv env = detect_launch_env();
  validate_mesh(cfg, env.world);
  const at::Device device = train_device(cfg, env);
  auto mesh = std::make_shared<Mesh>(cfg, make_world_comm(env, device.type()));
  const bool lead = mesh->rank() == 0;
  const int dp_rank = mesh->coord("dp"), dp = mesh->degree("dp");
  if (lead) {
    std::printf("vidit train: resolved config (%s)\n%s\n%s\n", cfg.source.c_str(), config_to_toml(cfg).c_str(),
                format_info(cfg, model_info(cfg)).c_str());
    if (env.world > 1)
      std::printf("distributed: %d processes (%s, %s), data parallel over %d (parameters sharded over %d), "
                  "tokens split over %d (ulysses %d x ring %d), heads and MLP split over %d (tensor)\n",
                  env.world, env.launcher.c_str(), mesh->world()->backend().c_str(), dp, mesh->degree("shard"),
                  mesh->degree("sp"), mesh->degree("ulysses"), mesh->degree("ring"), mesh->degree("tensor"));
  }
  // Rank 0 holds out_dir for this run alone, and checks that a checkpoint fits there; an error
  // here ends every rank (main's abort_world).
  std::unique_ptr<RunLock> lock;
  if (lead) {
    lock = std::make_unique<RunLock>(cfg.train.out_dir);
    if (!lock->took_over().empty()) std::printf("%s\n", lock->took_over().c_str());
    const double copies = 3 + (cfg.train.ema_decay > 0 ? 1 : 0);  // weights, AdamW's two moments, EMA
    check_out_dir(cfg.train.out_dir, uint64_t(1.1 * copies * 4 * double(model_info(cfg).params)));
    if (fresh) set_aside_previous_run(cfg.train.out_dir);
  }
  // train.preflight: the health checks first; an unhealthy host stops the job before it starts
  // (every rank sees the same report).
  if (cfg.train.preflight) {
    if (cfg.train.threads > 0) at::set_num_threads(int(cfg.train.threads));
    if (!preflight(cfg, *mesh->world(), device, "").healthy()) {
      if (lead) std::fprintf(stderr, "error: train.preflight: unhealthy host(s); not training. Start the job without "
                                     "them (the exclude list above) and run the same command\n");
      return kUnhealthyStatus;
    }
  }
  std::shared_ptr<BatchSource> data;
  std::string cache_dir;  // the latent cache this rank reads ("" for synthetic data)
  std::shared_ptr<const LatentCache> train_cache;  // its index (data.val_fraction holds clips out of it)
  if (cfg.data.source == DataSource::demo) {
    // Each rank renders the (deterministic) demo videos and caches them in its own folder.
    const std::string dir = lead ? cfg.train.out_dir : cfg.train.out_dir + "/rank" + std::to_string(mesh->rank());
    demo::DemoData demo_data = demo::prepare_demo_data(cfg, dir, dp_rank, dp);
    data = demo_data.loader;
    cache_dir = demo_data.cache_dir;
    train_cache = std::make_shared<const LatentCache>(cache_dir);
  } else if (cfg.data.source == DataSource::cache) {
    cache_dir = cfg.data.cache_dir;
    auto cache = std::make_shared<LatentCache>(cfg.data.cache_dir);
    train_cache = cache;
    // data.balance = "cost": batches sized by this run's measured step times, measured by rank 0
    // once and kept in out_dir/cost_model.json, so a restart builds the same batches
    // (train/cost_calibration.h). Rank 0 made out_dir above (RunLock).
    std::optional<CostModel> costs;
    if (cfg.data.balance == Balance::cost)
      costs = calibrate_cost_model(cfg, latent_buckets(*cache), device, *mesh->world(), cfg.train.out_dir).model;
    auto loader = std::make_shared<CacheLoader>(cache, cfg, dp_rank, dp, /*pin=*/false, costs);
    if (lead)
      std::printf("latent cache %s: %lld samples in %zu buckets, %lld tokens per batch\n", cfg.data.cache_dir.c_str(),
                  (long long)cache->size(), loader->bucket_names().size(), (long long)loader->token_budget());
    if (lead) std::printf("  loader: %s\n", loader->plan().c_str());
    data = loader;
  } else {
    data = std::make_shared<EpochBatchSource>(std::make_shared<SyntheticDataset>(cfg, 4096, cfg.train.seed),
                                              cfg.train.seed, dp_rank, dp);
  }
  // Caption dropout's null text: the empty prompt's umT5 embedding when the cache holds one
  // (prepare/caption_store.h), else zeros.
  at::Tensor null_text = cfg.data.source == DataSource::cache ? cached_null_text(cfg.data.cache_dir, cfg.model.text_len)
                                                              : at::Tensor();
  if (!null_text.defined()) null_text = at::zeros({cfg.model.text_len, cfg.model.text_dim});
  Trainer trainer(cfg, data, null_text, device, mesh);
  // Validation (data.val_fraction / data.val_cache): the held-out clips' loss every train.val_every
  // steps (train/validation.h).
  if (auto set = validation_set(cfg, train_cache)) {
    if (lead)
      std::printf("validation: %s, at sigma %s, every %lld steps\n", set->describe().c_str(),
                  c10::str(c10::ArrayRef<double>(cfg.train.val_sigmas)).c_str(), (long long)cfg.train.val_every);
    trainer.set_validator(std::make_unique<Validator>(cfg, std::move(*set), device));
  }
  // A run continues from the newest good checkpoint in its out_dir (a restart by the launcher
  // or the scheduler needs no flag); --fresh starts at step 0 (the old run set aside above).
  if (!fresh) {
    const bool found = trainer.resume();
    if (lead && found) std::printf("resumed from step %lld\n", (long long)trainer.steps_done());
    else if (lead) std::printf("no checkpoint in %s/checkpoints: starting from step 0\n", cfg.train.out_dir.c_str());
  } else if (lead) {
    std::printf("--fresh: starting from step 0\n");
  }
  {
    // The run's diagnostic record starts each attempt with who ran it, where (vidit doctor).
    std::vector<std::string> hosts = trainer.hosts();
    std::sort(hosts.begin(), hosts.end());
    hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
    trainer.events().write(trainer.steps_done() > 0 ? "resumed" : "started", trainer.steps_done(),
                           {{"attempt", launcher_attempt()}, {"world", env.world}, {"launcher", env.launcher},
                            {"backend", mesh->world()->backend()}, {"hosts", hosts}, {"rank_hosts", trainer.hosts()}});
    // The ranks the previous attempt lost without a word, and hosts that keep losing them
    // (diagnose/crashes.h), read before this attempt's heartbeats replace theirs.
    std::vector<std::string> excluded;
    if (lead)
      excluded = note_crashes(cfg.train.out_dir, trainer.events(), trainer.steps_done(), cfg.train.exclude_after_crashes,
                              exclude_list_path(cfg.train));
    // In a Slurm allocation the batch script can place the job elsewhere (scripts/slurm/vidit.sbatch
    // resubmits it without the listed hosts), so an attempt does not go on training on a host
    // it has just excluded; under other launchers the hosts are fixed, and the list is advice
    // for the next allocation.
    const std::vector<std::string>& here = trainer.hosts();
    const bool on_excluded = std::any_of(excluded.begin(), excluded.end(), [&](const std::string& h) {
      return std::find(here.begin(), here.end(), h) != here.end();
    });
    const bool in_slurm_job = std::getenv("SLURM_JOB_ID") != nullptr;
    at::Tensor stop = at::tensor({on_excluded && in_slurm_job ? 1.0 : 0.0}, at::kDouble);
    mesh->world()->all_reduce(stop, ReduceOp::Max)->wait();
    if (stop.item<double>() > 0) {
      if (lead)
        std::fprintf(stderr, "error: this allocation holds a host that was just excluded; not training on it. The batch "
                             "script resubmits the job without it (sbatch --exclude)\n");
      return kUnhealthyStatus;
    }
  }
  // sample.every: the run's prompts sampled every N steps with its sampling weights, by every rank
  // with the run's own parallelized model (each its part of the weights), written by rank 0
  // (pipeline/training_samples.h). The prompts are embedded once, on rank 0, and shared; a round
  // that fails is reported and training goes on.
  const bool sampling = cfg.sample.every > 0 && !cache_dir.empty();
  if (cfg.sample.every > 0 && cache_dir.empty() && lead)
    std::printf("sample.every: synthetic data (data.source = \"synthetic\") has no captions or sizes to sample; no samples\n");
  std::unique_ptr<TrainingSamples> samples;
  if (sampling) {
    samples = lead ? std::make_unique<TrainingSamples>(cfg, training_sample_prompts(cfg, LatentCache(cache_dir)), null_text, device)
                   : std::make_unique<TrainingSamples>(cfg, device);
    samples->share(*mesh->world());
    if (lead)
      std::printf("sample.every = %lld: %zu prompt(s) to %s/samples/ and TensorBoard\n", (long long)cfg.sample.every,
                  samples->prompts().size(), cfg.train.out_dir.c_str());
  }
  auto sample_round = [&](const StepResult& r) {
    if (!sampling || !(r.step % cfg.sample.every == 0 || r.step == cfg.train.steps)) return;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      std::vector<std::string> paths;
      trainer.with_sampling_weights(
          [&](DiT& model) { paths = samples->write_on_mesh(model, *mesh, r.step, trainer.tensorboard()); });
      if (lead)
        std::printf("[sample] step %lld: %zu video(s) in %s (%.1f s)\n", (long long)r.step, paths.size(),
                    paths.empty() ? "-" : std::filesystem::path(paths[0]).parent_path().c_str(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "warning: sample.every: the samples of step %lld failed on rank %d (%s); training goes on\n",
                   (long long)r.step, mesh->rank(), e.what());
    }
    std::fflush(stdout);
    mesh->world()->barrier();
  };
  install_stop_handlers();  // SIGTERM / SIGUSR1 / SIGINT: finish the step, save, exit kRestartStatus
  auto losses = trainer.fit(max_steps, true, sample_round);
  if (trainer.stopped_by_request()) {
    trainer.events().write("stopped", trainer.steps_done(), {{"signal", stop_signal()}});
    if (lead) std::printf("stopped at step %lld; run the same command to continue\n", (long long)trainer.steps_done());
    return kRestartStatus;
  }
  trainer.events().write("finished", trainer.steps_done(), {{"final_loss", losses.empty() ? 0.0 : losses.back()}});
  if (lead)
    std::printf("done: %lld steps, final loss %.9g, checkpoint in %s/checkpoints\n", (long long)trainer.steps_done(),
                losses.empty() ? 0.0 : losses.back(), cfg.train.out_dir.c_str());
  return 0;
}

// What `vidit sample` is asked for beyond the config.
struct SampleArgs {
  std::string checkpoint, out = "samples", weights, text_encoder, tokenizer, vae, negative_prompt, size;
  std::string image, last_image, image_encoder;  // image-to-video
  std::vector<std::string> prompts;
  bool use_ema = true, negative_given = false;
  int64_t frames = 0;
  int64_t seed = -1;
};

// Wan sampling (pipeline/wan_pipeline.h): from a release (--weights) or a vidit checkpoint, with
// umT5 captions and the Wan VAE decoder, one MP4 per prompt.
// The folder a sample is written to (`out` itself, or its parent for one .mp4), made and tried
// with a file before any work: a sample is never computed only to be lost at the end.
void check_output_writable(const std::string& out, bool one_file) {
  namespace fs = std::filesystem;
  const fs::path dir = one_file ? fs::absolute(fs::path(out)).parent_path() : fs::path(out);
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path probe = dir / (".vidit_write_check_" + std::to_string(::getpid()));
  FILE* f = ec ? nullptr : std::fopen(probe.c_str(), "wb");
  const int err = ec ? ec.value() : f ? 0 : errno;
  if (f) std::fclose(f), fs::remove(probe, ec);
  VIDIT_CHECK(err == 0, "vidit sample: cannot write to '", dir.string(), "' (", std::strerror(err),
              "); choose another -o/--out. Nothing was sampled");
}

int sample_wan(Config cfg, const SampleArgs& a, const std::set<std::string>& sample_given) {
  WanWeights w;
  w.text_encoder = !a.text_encoder.empty() ? a.text_encoder : cfg.text.encoder;
  w.tokenizer = !a.tokenizer.empty() ? a.tokenizer : cfg.text.tokenizer;
  w.vae = !a.vae.empty() ? a.vae : cfg.data.vae_weights;
  w.image_encoder = !a.image_encoder.empty() ? a.image_encoder : cfg.data.image_encoder;
  TensorMap transformer;
  std::string source, release_line;
  if (!a.weights.empty()) {
    w.fill_from(a.weights);
    cfg.model = read_transformer_config(w.transformer);  // the release's shape, whatever the config says
    cfg.model.boundary = w.boundary;  // two experts (model/experts.h): where they split; 0 for one model
    // Wan 2.2 TI2V (as many channels in as out, on the Wan 2.2 VAE) makes video from text, or with
    // --image from a first frame it keeps in its latent (diffusion/frame_condition.h).
    if (cfg.model.in_channels == cfg.model.out_channels && !a.image.empty() && is_wan22_vae(w.vae))
      cfg.model.condition = FrameCondition::first_frame;
    source = w.transformer;
    // The release's own solver and shift, and Wan's steps, guidance and frame rate for it, unless
    // the config or --set names them (pipeline/release_sampling.h).
    int64_t pixels = 832 * 480;
    if (const auto x = a.size.find('x'); x != std::string::npos)
      pixels = std::atoll(a.size.substr(0, x).c_str()) * std::atoll(a.size.substr(x + 1).c_str());
    release_line = apply_release_sampling(cfg.sample, release_sampling(a.weights, cfg.model, pixels), sample_given);
  } else {
    std::string checkpoint = a.checkpoint;
    if (checkpoint.empty()) {
      auto latest = latest_checkpoint(cfg.train.out_dir);
      VIDIT_CHECK(latest, "no checkpoint under '", cfg.train.out_dir, "/checkpoints' and no --weights: train first, "
                  "or pass --checkpoint DIR or --weights DIR");
      checkpoint = *latest;
    }
    CheckpointWeights cw = read_checkpoint_weights(checkpoint, a.use_ema);
    transformer = std::move(cw.weights);
    source = checkpoint + (cw.ema ? " (EMA weights" : " (raw weights") + (cw.adapters.empty() ? ")" : ", LoRA merged)");
    w.transformer = checkpoint;
  }
  w.require_all();
  VIDIT_CHECK(cfg.model.boundary == 0 || !w.transformer_2.empty(), source, " is one expert of a two-expert model "
              "(model.boundary = ", cfg.model.boundary, "): a video needs both; export the run into its release "
              "(vidit export RUN OUT --pipeline RELEASE) and sample that with --weights OUT");
  const int64_t stride = vae_stride(w, cfg.model);  // 16 for the Wan 2.2 VAE (TI2V-5B)
  VideoRequest r;
  // Wan's defaults: 81 frames at 832x480; TI2V-5B's 121 at 1280x704.
  r.frames = a.frames > 0 ? a.frames : stride == 16 ? 121 : 81;
  if (stride == 16) r.width = 1280, r.height = 704;
  r.image = a.image, r.last_image = a.last_image;
  // A run that trained Wan 2.2 TI2V's first-frame form samples text-to-video too, without --image.
  if (fuses_first_frame(cfg.model) && a.image.empty()) cfg.model.condition = FrameCondition::none;
  const bool i2v = cfg.model.condition != FrameCondition::none;
  VIDIT_CHECK(i2v || (a.image.empty() && a.last_image.empty()), "--image: ", source, " is a text-to-video model "
              "(model.in_channels = ", cfg.model.in_channels, "); give an image-to-video release (in_channels = 2 x ",
              cfg.model.out_channels, " + 4) or leave --image out");
  VIDIT_CHECK(!i2v || !a.image.empty(), source, " is an image-to-video model (in_channels = ", cfg.model.in_channels,
              "): give the first frame with --image FILE (and --last-image FILE for first-and-last-frame)");
  VIDIT_CHECK(a.last_image.empty() || !a.image.empty(), "--last-image needs --image (the first frame)");
  VIDIT_CHECK(!i2v || cfg.model.image_dim == 0 || !w.image_encoder.empty(), source, " attends to CLIP image features "
              "(image_dim ", cfg.model.image_dim, "): give --image-encoder DIR (a transformers CLIPVisionModel folder), "
              "or --weights a pipeline folder with image_encoder/");
  if (!a.size.empty()) {
    const auto x = a.size.find('x');
    VIDIT_CHECK(x != std::string::npos, "--size '", a.size, "': give WIDTHxHEIGHT, e.g. 832x480");
    r.width = std::stoll(a.size.substr(0, x)), r.height = std::stoll(a.size.substr(x + 1));
  } else if (i2v) {
    // The first picture's aspect ratio at the default size's pixel area (pipeline/image_condition.h).
    const at::Tensor picture = vision::decode_image_file(r.image);
    std::tie(r.height, r.width) =
        size_for_image(picture.size(0), picture.size(1), r.width * r.height, stride * cfg.model.patch[1]);
  }
  r.seed = a.seed >= 0 ? uint64_t(a.seed) : cfg.sample.seed;
  // The negative prompt: --negative-prompt, else sample.negative_prompt, else with a Wan release
  // Wan's own default (configs/wan2.1-*.toml carry it too).
  r.negative_prompt = a.negative_given ? a.negative_prompt
                      : !cfg.sample.negative_prompt.empty() ? cfg.sample.negative_prompt
                      : !a.weights.empty()                  ? std::string(kWanNegativePrompt)
                                                            : std::string();
  // Under mpirun / torchrun / srun every rank takes a share of each sample (pipeline/sampling_ranks.h)
  // and rank 0 writes it; the ranks first agree that they were given the same job.
  const LaunchEnv env = detect_launch_env();
  const at::Device device = train_device(cfg, env);
  check_video_request(r, cfg.model, stride);
  const SamplingRanks ranks = make_sampling_ranks(cfg, latent_shape(r, cfg.model, stride), make_world_comm(env, device.type()));
  const bool lead = ranks.lead();
  // The memory plan (pipeline/sample_memory.h) against this rank's device: on a GPU its memory, on
  // the CPU the node's (train.host_memory_gb, else MemTotal) shared by the ranks on it. A job that
  // cannot fit is refused before any work, naming the phase and what changes it.
  {
    SampleMemoryInputs in = sample_memory_inputs(cfg, r, device, ranks.size(), stride);
    // The text encoder's own shape where its folder says it (config.json), else umT5-XXL's.
    const std::filesystem::path text_config = std::filesystem::path(w.text_encoder) / "config.json";
    if (std::filesystem::is_directory(w.text_encoder) && std::filesystem::is_regular_file(text_config))
      in.text = text::Umt5Config::from_json_file(text_config.string());
    const std::filesystem::path clip_config = std::filesystem::path(w.image_encoder) / "config.json";  // likewise CLIP's
    if (!w.image_encoder.empty() && std::filesystem::is_regular_file(clip_config))
      in.clip = vision::ClipVisionConfig::from_json_file(clip_config.string());
    const SampleMemory plan = predict_sample_memory(in);
    // The text and image phases, and an untiled decode, are rank 0's alone.
    double need = 0;
    std::string phase;
    for (const PhaseMemory& p : plan.phases)
      if ((lead || (p.name != "text" && p.name != "image" && (p.name != "decode" || in.tiled))) && double(p.peak) > need)
        need = double(p.peak), phase = p.name;
    const int local = std::max(1, env.local_world);
    const double have = device.is_cuda() ? double(cuda_total_bytes(device.index() < 0 ? 0 : device.index()))
                        : cfg.train.host_memory_gb > 0 ? cfg.train.host_memory_gb * 1e9 / local
                                                       : double(host_total_bytes()) / local;
    VIDIT_CHECK(have <= 0 || need <= have, "vidit sample: the ", phase, " phase needs ",
                need / double(1ull << 30), " GiB on rank ", ranks.rank(), " (vidit plan --sample ", r.frames, "x", r.width, "x",
                r.height, ranks.size() > 1 ? " --world " + std::to_string(ranks.size()) : std::string(), ") but ",
                device.is_cuda() ? "the GPU has " : "this rank's share of the node is ", have / double(1ull << 30),
                " GiB. Set sample.dtype = \"bf16\", sample on more ranks (the tokens split; parallel.shard shards the "
                "weights), or ask for fewer frames or pixels. Nothing was sampled");
  }
  const bool one_file = a.prompts.size() == 1 && a.out.size() > 4 && a.out.substr(a.out.size() - 4) == ".mp4";
  if (lead) check_output_writable(a.out, one_file);
  if (lead && !release_line.empty()) std::printf("%s", release_line.c_str()), std::fflush(stdout);
  if (ranks.size() > 1) {
    std::string job = std::to_string(r.frames) + "x" + std::to_string(r.width) + "x" + std::to_string(r.height) + " seed " +
                      std::to_string(r.seed) + "\n" + r.negative_prompt;
    for (const auto& p : a.prompts) job += "\n" + p;
    check_ranks_agree(*ranks.world,
                      {fingerprint(config_to_toml(cfg)), fingerprint(job),
                       weights_fingerprint(transformer.empty() ? read_transformer_weights(w.transformer) : transformer)},
                      {"a config", "prompts or video settings", "transformer weights"});
  }
  if (lead)
    std::printf("sampling %zu prompt(s): %s, %lld frames at %lldx%lld, %s %lld steps, shift %g, guidance %g, on %s%s\n",
                a.prompts.size(), source.c_str(), (long long)r.frames, (long long)r.width, (long long)r.height,
                name_of(cfg.sample.solver).c_str(), (long long)cfg.sample.steps, cfg.sample.shift, cfg.sample.cfg_scale,
                device.str().c_str(), ranks.size() > 1 ? (", " + ranks.describe()).c_str() : "");
  for (size_t i = 0; i < a.prompts.size(); ++i) {
    r.prompt = a.prompts[i];
    VideoResult v = generate_video(cfg, w, r, device, transformer, true, &ranks);
    if (!lead) continue;
    std::string path = a.out;
    if (!one_file) {
      std::string name = a.prompts[i].substr(0, 60);
      for (char& c : name)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      path = a.out + "/" + std::to_string(i) + "_" + name + ".mp4";
    }
    write_video(path, v.frames, cfg.sample.fps);
    std::printf("wrote %s (%lld frames, %g fps)", path.c_str(), (long long)v.frames.size(0), cfg.sample.fps);
    for (const auto& ph : v.phases)
      std::printf("; %s %.1f s, peak %.2f GiB", ph.name.c_str(), ph.seconds, ph.peak_bytes / double(1ll << 30));
    std::printf("\n");
  }
  return 0;
}

int cmd_sample(const CommonOpts& o, const SampleArgs& a) {
  Config cfg = load_config(o.config, o.sets);
  // Wan sampling when a release, a text encoder or the Wan VAE's latents are involved.
  if (!a.weights.empty() || !a.text_encoder.empty() || !cfg.text.encoder.empty() || cfg.data.codec == Codec::wan_vae)
    return sample_wan(cfg, a, sample_keys_given(o.config, o.sets));
  std::string checkpoint = a.checkpoint;
  if (checkpoint.empty()) {
    auto latest = latest_checkpoint(cfg.train.out_dir);
    VIDIT_CHECK(latest, "no checkpoint under '", cfg.train.out_dir,
                "/checkpoints': train first or pass --checkpoint DIR");
    checkpoint = *latest;
  }
  const CheckpointWeights s = read_checkpoint_weights(checkpoint, a.use_ema);
  DiT model = dit_without_storage(cfg.model, at::kCPU);
  const bool ema = s.ema;
  load_state_dict(*model, s.weights, checkpoint + (ema ? "/ema.safetensors" : "/model.safetensors"));
  VIDIT_CHECK(cfg.data.source == DataSource::demo, "vidit sample: text prompts need a text encoder: the demo's "
              "caption embedder (data.source = \"demo\"), or umT5 (--text-encoder DIR / text.encoder, or --weights DIR)");
  VIDIT_CHECK(!a.prompts.empty(), "vidit sample: give at least one --prompt \"a red square moving left\"");
  check_output_writable(a.out, false);
  auto clips = demo::sample_captions(model, cfg, a.prompts, cfg.sample.seed);
  for (size_t i = 0; i < clips.size(); ++i) {
    std::string name = a.prompts[i];
    std::replace(name.begin(), name.end(), ' ', '_');
    std::string path = a.out + "/" + std::to_string(i) + "_" + name + ".mp4";
    encode_video_mp4(path, clips[i], 8.0, 10, 4);
    std::printf("wrote %s (step %lld, %s weights)\n", path.c_str(), (long long)s.step, ema ? "EMA" : "raw");
  }
  return 0;
}

// Which slice of the manifest this process prepares: --worker/--workers, else the launcher's
// environment (OpenMPI, Slurm, torchrun), else 0 of 1.
std::pair<int, int> prepare_slice(int worker, int workers) {
  if (workers > 0) return {worker, workers};
  LaunchEnv env = detect_launch_env();
  return {env.rank, env.world};
}

int cmd_prepare(const CommonOpts& o, int worker, int workers, bool merge_only, bool verify) {
  Config cfg = load_config(o.config, o.sets);
  VIDIT_CHECK(!cfg.data.cache_dir.empty(), cfg.source, ": set data.cache_dir (where the latent cache goes)");
  if (verify) {
    LatentCache cache(cfg.data.cache_dir);
    auto bad = cache.verify_all();
    for (const auto& b : bad) std::printf("BAD %s\n", b.c_str());
    // And the inputs: entries their inputs no longer match (with data.manifest set).
    StaleReport inputs;
    if (!cfg.data.manifest.empty()) {
      std::vector<CacheIndexEntry> entries;
      for (int64_t i = 0; i < cache.size(); ++i) entries.push_back(cache.entry(i));
      inputs = stale_entries(cfg, entries);
      for (const auto& s : inputs.stale) std::printf("STALE %s\n", s.c_str());
    }
    const auto& stale = inputs.stale;
    std::printf("verified %lld samples in %s: %zu failed their checksum, %zu stale, %lld not in the manifest\n",
                (long long)cache.size(), cfg.data.cache_dir.c_str(), bad.size(), stale.size(), (long long)inputs.missing);
    if (inputs.unrecorded > 0)
      std::printf("%lld samples recorded nothing of how they were made (written before vidit kept records): their "
                  "captions were compared, not their videos or settings\n", (long long)inputs.unrecorded);
    return !bad.empty() ? 4 : !stale.empty() ? 5 : 0;
  }
  if (merge_only) {
    std::printf("merged %lld samples into %s/index.jsonl\n", (long long)merge_prepared(cfg.data.cache_dir),
                cfg.data.cache_dir.c_str());
    return 0;
  }
  auto [w, n] = prepare_slice(worker, workers);
  CaptionEncoder captions = make_caption_encoder(cfg);
  // umT5 captions (text.encoder): all of this slice's captions first, the encoder freed before the VAE.
  CaptionStoreReport text_report;
  if (!cfg.text.encoder.empty()) {
    VIDIT_CHECK(cfg.data.text_encoder != TextEncoder::precomputed, cfg.source, ": text.encoder is set but "
                "data.text_encoder = \"precomputed\" reads embedding files; keep one of the two");
    Manifest m = read_manifest(cfg.data.manifest);
    std::vector<std::string> texts;
    for (size_t i = 0; i < m.entries.size(); ++i)
      if (worker_takes(m, i, w, n)) texts.push_back(m.entries[i].caption);
    captions = CaptionStore::build(cfg, texts, w, &text_report).encoder();
    std::printf("captions: %lld distinct, %lld embedded now in %.1f s, %lld cut to %lld tokens, %lld not embeddable\n",
                (long long)text_report.captions, (long long)text_report.embedded, text_report.seconds,
                (long long)text_report.truncated, (long long)cfg.model.text_len, (long long)text_report.failed);
  }
  std::printf("vidit prepare: %s -> %s (worker %d of %d, codec %s)\n", cfg.data.manifest.c_str(),
              cfg.data.cache_dir.c_str(), w, n, name_of(cfg.data.codec).c_str());
  std::fflush(stdout);
  Progress::Options progress;  // an updating line on a terminal, else a line every VIDIT_PROGRESS_SECONDS (10)
  PrepareReport r = prepare_cache(cfg, make_frame_encoder(cfg), captions, w, n, &progress, make_condition_encoder(cfg));
  std::printf("%s", prepare_summary(r, n > 1 ? "summary of worker " + std::to_string(w) + " of " + std::to_string(n)
                                             : std::string("summary")).c_str());
  std::printf("prepared %lld entries in %.1f s: %lld written, %lld already cached, %lld re-embedded (new caption), "
              "%lld rejected (see %s/rejects%s)\n", (long long)r.entries, r.seconds,
              (long long)r.written, (long long)r.already_done, (long long)r.reembedded, (long long)r.rejected,
              cfg.data.cache_dir.c_str(), r.merged ? ".jsonl" : "/");
  if (r.merged && n > 1)
    std::printf("%s", prepare_summary(prepare_totals(cfg.data.cache_dir, n), "summary of all " + std::to_string(n) + " workers").c_str());
  if (r.merged) std::printf("index merged: %s/index.jsonl\n", cfg.data.cache_dir.c_str());
  return 0;
}

// vidit encode-text: captions -> umT5 (Wan's text encoder) -> one safetensors file holding
// text_embedding [B, text_len, d] fp32 (zeros after each caption's tokens) and lengths [B] int64
// (real tokens, EOS included); the captions go in the file's metadata.
int cmd_encode_text(const CommonOpts& o, const std::string& encoder, const std::string& tokenizer, int64_t text_len,
                    const std::vector<std::string>& captions, const std::string& out) {
  Config cfg = load_config(o.config, o.sets);
  text::TextEncoderOptions opts = text::text_encoder_options(cfg);
  if (!encoder.empty()) opts.encoder = encoder;
  if (!tokenizer.empty()) opts.tokenizer = tokenizer;
  if (text_len > 0) opts.text_len = text_len;
  text::TextEncoder te(opts);
  const auto t0 = std::chrono::steady_clock::now();
  const text::EncodedCaptions e = te.encode_captions(captions);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json meta_captions = captions;
  save_safetensors(out, {{"text_embedding", e.embedding}, {"lengths", at::tensor(e.lengths, at::kLong)}},
                   {{"captions", meta_captions.dump()}, {"text_len", std::to_string(opts.text_len)},
                    {"encoder", opts.encoder}});
  std::printf("%s: text_embedding [%lld, %lld, %lld] from %s (%s, %s) in %.2f s\n", out.c_str(),
              (long long)captions.size(), (long long)opts.text_len, (long long)te.dim(), opts.encoder.c_str(),
              opts.dtype == at::kFloat ? "fp32" : "bf16", opts.device.str().c_str(), seconds);
  for (size_t i = 0; i < captions.size(); ++i)
    if (e.truncated[i])
      std::printf("  caption %zu cut to %lld tokens (raise --text-len to keep it whole)\n", i, (long long)opts.text_len);
  return 0;
}

// vidit export: a checkpoint (or a run's newest) to a folder diffusers or Wan's own code opens:
// the transformer's EMA weights (or --raw), put back together from however many ranks saved
// them, with the config.json of the layout (a LoRA run's adapters merged onto its base). The
// model shape comes from the checkpoint's config. --format lora: a LoRA run's adapters alone, as
// the one safetensors file diffusers' load_lora_weights and ComfyUI read (model/lora.h).
int cmd_export(const std::string& format, const std::string& from, const std::string& out, bool use_ema,
               double shard_gb, const std::string& pipeline) {
  // The weights as a stream (train/run_weights.h): written one tensor at a time, so the host
  // never holds the whole model; --format lora reads the adapters alone.
  const CheckpointStream w = open_checkpoint_weights(from, use_ema);
  const char* which = w.ema ? "EMA" : "raw";
  if (format == "lora") {
    VIDIT_CHECK(!w.adapters.empty(), "vidit export --format lora: ", w.checkpoint, " is not a LoRA run (lora.rank = 0); "
                "export it as a whole model with --format diffusers or wan");
    VIDIT_CHECK(!std::filesystem::exists(out), "vidit export: '", out, "' exists; give a new file name (nothing was written)");
    const TensorMap file = lora_file_tensors(w.adapters, w.lora_scale, at::kBFloat16);
    const std::string tmp = out + ".tmp";
    save_safetensors(tmp, file, {{"format", "pt"},
                                 {"ss_network_module", "lora"},
                                 {"ss_network_dim", std::to_string(w.config.lora.rank)},
                                 {"ss_network_alpha", std::to_string(w.lora_scale * double(w.config.lora.rank))},
                                 {"vidit_step", std::to_string(w.step)},
                                 // which expert of a two-expert model the adapters belong to ("none": one model)
                                 {"vidit_expert", name_of(w.config.train.expert)}});
    std::filesystem::rename(tmp, out);
    std::printf("exported the LoRA adapters of %s (step %lld, %s; rank %lld, alpha %g, %zu projections) to %s\n",
                w.checkpoint.c_str(), (long long)w.step, which, (long long)w.config.lora.rank,
                w.lora_scale * double(w.config.lora.rank), w.adapters.size() / 2, out.c_str());
    return 0;
  }
  const uint64_t shard = uint64_t(shard_gb * 1e9);
  if (!pipeline.empty()) {
    // A release in diffusers' layout, or Wan 2.2's own two-expert layout (no model_index.json).
    const bool official = !std::filesystem::exists(std::filesystem::path(pipeline) / "model_index.json") &&
                          std::filesystem::is_directory(std::filesystem::path(pipeline) / "high_noise_model");
    VIDIT_CHECK(format == (official ? "wan" : "diffusers") || format == "diffusers", "vidit export --pipeline writes "
                "the release's own layout; drop --format ", format);
    const PipelineExport p =
        official ? write_official_expert_release(w.weights, w.config.model, pipeline, out, shard, w.config.train.expert)
                 : write_diffusers_pipeline(w.weights, w.config.model, pipeline, out, shard, w.config.train.expert);
    std::string parts;
    for (const auto& c : p.components) parts += (parts.empty() ? "" : ", ") + c;
    std::printf("exported %s (step %lld, %s weights%s) to %s as a %s: %s/ written, %s from %s "
                "(%lld files hard-linked, %.3g GB; %lld copied, %.3g GB)\n",
                w.checkpoint.c_str(), (long long)w.step, which, w.adapters.empty() ? "" : ", LoRA merged onto its base",
                out.c_str(), p.pipeline_class.c_str(), p.transformer.c_str(), parts.c_str(), pipeline.c_str(), (long long)p.linked_files,
                double(p.linked_bytes) / 1e9, (long long)p.copied_files, double(p.copied_bytes) / 1e9);
    return 0;
  }
  if (format == "diffusers")
    write_diffusers_transformer(w.weights, w.config.model, out, shard);
  else
    write_wan_transformer(w.weights, w.config.model, out, shard);
  std::printf("exported %s (step %lld, %s weights%s) to %s in the %s layout\n", w.checkpoint.c_str(), (long long)w.step,
              which, w.adapters.empty() ? "" : ", LoRA merged onto its base", out.c_str(), format.c_str());
  return 0;
}

// vidit checkpoint verify DIR: reads every tensor and checks it against the manifest.
int cmd_verify(const std::string& dir) {
  CheckpointReader r(dir);
  int64_t tensors = 0;
  for (const char* what : {"model", "ema", "optimizer"}) {
    if (!r.has(what)) continue;
    for (const auto& key : r.keys(what)) r.whole(what, key), ++tensors;
  }
  std::printf("%s: step %lld, %lld tensors, every one matches its checksum\n", dir.c_str(), (long long)r.meta().step,
              (long long)tensors);
  return 0;
}

// vidit checkpoint compare A B: 0 when both hold the same step and bitwise the same tensors
// (whatever mesh each was saved at); else the differences, and 1. The spike detector's
// baselines (optimizer keys spikes/*) are diagnostics, not training state, and are compared to a
// relative 1e-6: another mesh sums the per-block gradient norms they learn from in another order.
int cmd_compare(const std::string& a, const std::string& b) {
  CheckpointReader x(a), y(b);
  int differences = 0;
  auto differ = [&](const std::string& what) {
    if (differences++ < 10) std::printf("  %s\n", what.c_str());
  };
  if (x.meta().step != y.meta().step)
    differ("step " + std::to_string(x.meta().step) + " vs " + std::to_string(y.meta().step));
  for (const char* what : {"model", "ema", "optimizer"}) {
    if (x.has(what) != y.has(what)) {
      differ(std::string(what) + ": in one of them only");
      continue;
    }
    if (!x.has(what)) continue;
    const std::vector<std::string> kx = x.keys(what), ky = y.keys(what);
    if (kx != ky) differ(std::string(what) + ": other keys");
    for (const auto& key : kx) {
      if (std::find(ky.begin(), ky.end(), key) == ky.end()) continue;
      const at::Tensor tx = x.whole(what, key), ty = y.whole(what, key);
      if (tx.sizes() != ty.sizes() || tx.scalar_type() != ty.scalar_type())
        differ(std::string(what) + " " + key + ": other shape or dtype");
      else if (key.rfind("spikes/", 0) == 0 ? !at::allclose(tx, ty, 1e-6, 1e-9) : !at::equal(tx, ty))
        differ(std::string(what) + " " + key + ": max |difference| " +
               std::to_string((tx.to(at::kDouble) - ty.to(at::kDouble)).abs().max().item<double>()));
    }
  }
  if (differences == 0) {
    std::printf("equal: %s and %s hold bitwise the same state (step %lld)\n", a.c_str(), b.c_str(),
                (long long)x.meta().step);
    return 0;
  }
  std::printf("%d difference(s) between %s and %s\n", differences, a.c_str(), b.c_str());
  return 1;
}

int cmd_demo(const CommonOpts& o, bool resume) {
  Config cfg = load_config(o.config, o.sets);
  const LaunchEnv env = detect_launch_env();
  // `mpirun -np N vidit demo` with no [parallel] degrees: plain data parallel over the N.
  const auto& p = cfg.parallel;
  if (p.replicate * p.shard * p.ulysses * p.ring * p.tensor == 1) cfg.parallel.replicate = env.world;
  validate_mesh(cfg, env.world);
  // The demo's model is too small for intra-op threads to pay (its step is faster on one thread
  // than on two), and one thread makes its result the same on every machine whatever its core
  // count: train.threads = 0 ("every core") means 1 here.
  const bool one_thread = cfg.train.threads == 0;
  if (one_thread) cfg.train.threads = 1;
  auto mesh = std::make_shared<Mesh>(cfg, make_world_comm(env));
  if (mesh->rank() == 0) {
    std::printf("vidit demo: %s\n", format_info(cfg, model_info(cfg)).c_str());
    if (one_thread) std::printf("training on one CPU thread per process (--set train.threads=N for N)\n");
    if (mesh->size() > 1)
      std::printf("distributed: %d processes, data parallel over %d (parameters sharded over %d), tokens split over "
                  "%d, heads split over %d\n",
                  env.world, mesh->degree("dp"), mesh->degree("shard"), mesh->degree("sp"), mesh->degree("tensor"));
  }
  auto report = demo::run_demo(cfg, resume, mesh);
  return report.adherence() >= 0.9 ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  vidit::keep_freed_memory();  // before any tensor exists
  // Every line reaches a log file (a Slurm job's) as it is printed, also if the job is killed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"vidit: train video Diffusion Transformers with flow matching"};
  app.require_subcommand(1);
  CommonOpts o;
  bool resume = false;
  int64_t max_steps = -1;

  auto* info = app.add_subcommand("info", "parameters, FLOPs per sample and training memory of a config");
  add_common(info, o);
  int64_t plan_world = 0;
  double gpu_gib = 0;
  auto* plan = app.add_subcommand("plan", "memory and bytes sent per rank for the config's mesh, or every mesh of --world ranks");
  add_common(plan, o);
  plan->add_option("--world", plan_world, "list every mesh of this many ranks (fewest bytes sent first)");
  plan->add_option("--gpu-memory", gpu_gib, "GiB per GPU: mark the meshes whose memory per rank fits");
  std::string plan_measure, plan_rates;
  plan->add_option("--measure", plan_measure, "predict the step time and MFU from this device's measured rates")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  std::string plan_sample, plan_sample_on = "cuda";
  plan->add_option("--sample", plan_sample, "the peak memory of `vidit sample` per phase at FRAMESxWIDTHxHEIGHT (e.g. 81x832x480)");
  plan->add_option("--sample-on", plan_sample_on, "where --sample runs: cuda (default) or cpu")->check(CLI::IsMember({"cpu", "cuda"}));
  plan->add_option("--rates", plan_rates,
                   "predict from given rates: matmul=,attention=,peak= (TFLOP/s), memory=,link= (GB/s); with "
                   "--measure, these replace the measured ones");
  auto* keys = app.add_subcommand("keys", "every configuration key with its type, default and doc (Markdown)");
  auto* train = app.add_subcommand("train", "train a model");
  add_common(train, o);
  bool fresh = false;
  train->add_flag("--fresh", fresh,
                  "start at step 0 even when train.out_dir has checkpoints (they and the metrics are moved to "
                  "<out_dir>/previous-<time>/); without it a run continues from the newest good checkpoint");
  bool resume_flag = false;
  train->add_flag("--resume", resume_flag, "the default (kept for scripts that pass it)");
  train->add_option("--max-steps", max_steps, "stop after this step (the schedule still uses train.steps)");
  SampleArgs sa;
  auto* sample = app.add_subcommand("sample", "generate videos: from a Wan release (--weights) or a checkpoint");
  add_common(sample, o);
  sample->add_option("--checkpoint", sa.checkpoint, "checkpoint directory (default: latest in train.out_dir)");
  sample->add_option("--weights", sa.weights, "a Wan 2.1 release: a diffusers pipeline folder or an official one "
                                              "(transformer, umT5, tokenizer and VAE from it)");
  sample->add_option("--text-encoder", sa.text_encoder, "umT5 weights (default: text.encoder, else from --weights)");
  sample->add_option("--tokenizer", sa.tokenizer, "spiece.model or its folder (default: beside the text encoder)");
  sample->add_option("--vae", sa.vae, "Wan 2.1 VAE: a .safetensors file (official or diffusers names), a diffusers vae/ folder or pipeline folder (default: data.vae_weights, else from --weights)");
  sample->add_option("-p,--prompt", sa.prompts, "caption to generate (repeatable)")->required();
  sample->add_option("--negative-prompt", sa.negative_prompt, "what guidance steers away from (default: "
                     "sample.negative_prompt; with --weights, Wan's own)")
      ->each([&](const std::string&) { sa.negative_given = true; });
  sample->add_option("--frames", sa.frames, "frames per video, 1 + 4k (Wan: 81)")->check(CLI::PositiveNumber);
  sample->add_option("--size", sa.size, "WIDTHxHEIGHT, multiples of 16 (Wan: 832x480 or 1280x720)");
  sample->add_option("--seed", sa.seed, "noise seed (default: sample.seed)");
  sample->add_option("--image", sa.image, "image-to-video: the first frame (PNG, JPEG, WebP, ...); without --size "
                     "the video takes its aspect ratio at 832x480's area");
  sample->add_option("--last-image", sa.last_image, "first-and-last-frame: the last frame");
  sample->add_option("--image-encoder", sa.image_encoder, "the CLIP image encoder (a transformers CLIPVisionModel "
                     "folder; default: data.image_encoder, else image_encoder/ of --weights)");
  sample->add_option("-o,--out", sa.out, "output: a folder, or a .mp4 file for one prompt");
  sample->add_flag("!--raw", sa.use_ema, "use the raw weights instead of the EMA weights");
  int worker = 0, workers = 0;
  bool merge_only = false, verify = false;
  auto* prepare = app.add_subcommand("prepare", "decode, bucket and encode the manifest's videos into the latent cache");
  add_common(prepare, o);
  prepare->add_option("--worker", worker, "this process's slice of the manifest (default: from mpirun / srun / torchrun)");
  prepare->add_option("--workers", workers, "number of slices (processes)");
  prepare->add_flag("--merge", merge_only, "only merge the workers' index parts and rejects");
  prepare->add_flag("--verify", verify, "re-check every cached sample's checksum");
  auto* ckpt = app.add_subcommand("checkpoint", "check checkpoints");
  ckpt->require_subcommand(1);
  std::string ckpt_a, ckpt_b;
  auto* verify_ckpt = ckpt->add_subcommand("verify", "read every tensor of a checkpoint and check its checksum");
  verify_ckpt->add_option("dir", ckpt_a, "checkpoint directory")->required();
  auto* seal_ckpt = ckpt->add_subcommand(
      "seal", "record checksums for a first-format checkpoint saved without manifest.json (you vouch for its files)");
  seal_ckpt->add_option("dir", ckpt_a, "checkpoint directory")->required();
  auto* compare_ckpt = ckpt->add_subcommand("compare", "exit 0 when two checkpoints hold bitwise the same state");
  compare_ckpt->add_option("a", ckpt_a, "checkpoint directory")->required();
  compare_ckpt->add_option("b", ckpt_b, "checkpoint directory")->required();
  std::string exclude_file;
  std::vector<std::string> checks = {"device", "network", "storage"};
  auto* health = app.add_subcommand("health", "pre-flight checks of every rank and host of the launch (matmul, memory, "
                                              "all-reduce, out_dir); unhealthy hosts go to an exclude list");
  health->add_option("--exclude-file", exclude_file, "the exclude list (default <train.out_dir>/exclude_hosts.txt)");
  health->add_option("--checks", checks, "which checks: a comma-separated list of device (matmul, memory), network "
                                         "(all-reduces in each host, over all, between node pairs), storage (out_dir)")
      ->delimiter(',')
      ->check(CLI::IsMember({"device", "network", "storage"}));
  add_common(health, o);
  std::string doctor_dir;
  auto* doctor = app.add_subcommand("doctor", "what happened in a run: restarts, skipped steps, spikes, stragglers, "
                                              "corruption, and the hosts worth a look");
  doctor->add_option("run_dir", doctor_dir, "the run's train.out_dir")->required();
  std::string text_encoder_dir, tokenizer_path, embedding_out;
  int64_t text_len = 0;
  std::vector<std::string> captions;
  auto* encode_text = app.add_subcommand("encode-text", "embed captions with umT5 (Wan's text encoder) into a "
                                                        "safetensors file (text_embedding [B, text_len, d], lengths)");
  add_common(encode_text, o);
  encode_text->add_option("--text-encoder", text_encoder_dir, "umT5 weights: a text_encoder folder, a diffusers "
                                                              "pipeline folder or a weight file (default: text.encoder)");
  encode_text->add_option("--tokenizer", tokenizer_path, "spiece.model or its folder (default: text.tokenizer, else "
                                                         "found beside the encoder)");
  encode_text->add_option("--text-len", text_len, "tokens per caption (default: model.text_len; Wan: 512)")
      ->check(CLI::PositiveNumber);
  encode_text->add_option("captions", captions, "captions to embed (\"\" is the null prompt)")->required();
  encode_text->add_option("-o,--out", embedding_out, "output .safetensors file")->required();
  std::string export_format = "diffusers", export_from, export_out;
  bool export_ema = true;
  double export_shard_gb = 10;
  std::string export_pipeline;
  auto* exp = app.add_subcommand("export", "write a checkpoint's transformer as a folder diffusers "
                                           "(WanTransformer3DModel.from_pretrained) or Wan's code opens");
  exp->add_option("--format", export_format, "diffusers, wan, or lora (a LoRA run's adapters alone, one .safetensors "
                  "file for diffusers' load_lora_weights and ComfyUI)")
      ->check(CLI::IsMember({"diffusers", "wan", "lora"}));
  exp->add_option("from", export_from, "a run folder (its newest checkpoint) or a checkpoint folder")->required();
  exp->add_option("out", export_out, "the folder to write (must not exist, or be empty)")->required();
  exp->add_flag("!--raw", export_ema, "export the raw weights instead of the EMA weights");
  exp->add_option("--pipeline", export_pipeline, "write a whole pipeline folder (WanPipeline / WanImageToVideoPipeline"
                  ".from_pretrained, vidit sample --weights): the transformer from the checkpoint, every other "
                  "component hard-linked from this diffusers release");
  exp->add_option("--shard-gb", export_shard_gb, "largest safetensors file, in GB (diffusers' default: 10)")
      ->check(CLI::PositiveNumber);
  auto* demo = app.add_subcommand("demo", "the embedded end-to-end demo: make videos, train, sample, check");
  add_common(demo, o);
  demo->add_flag("--resume", resume, "continue from the latest checkpoint in train.out_dir");

  CLI11_PARSE(app, argc, argv);
  try {
    if (info->parsed()) return cmd_info(o);
    if (keys->parsed()) return std::printf("%s", config_reference().c_str()) < 0;
    if (plan->parsed()) return cmd_plan(o, plan_world, gpu_gib, plan_measure, plan_rates, plan_sample, plan_sample_on);
    if (train->parsed()) return cmd_train(o, fresh, max_steps);
    if (sample->parsed()) return cmd_sample(o, sa);
    if (exp->parsed()) return cmd_export(export_format, export_from, export_out, export_ema, export_shard_gb, export_pipeline);
    if (demo->parsed()) return cmd_demo(o, resume);
    if (verify_ckpt->parsed()) return cmd_verify(ckpt_a);
    if (seal_ckpt->parsed()) {
      const int64_t n = seal_checkpoint(ckpt_a);
      std::printf("%s: manifest.json written for %lld tensors as they are now; resumes verify against it\n",
                  ckpt_a.c_str(), (long long)n);
      return 0;
    }
    if (health->parsed()) return cmd_health(o, exclude_file, checks);
    if (doctor->parsed()) return std::printf("%s", doctor_report(doctor_dir).c_str()) < 0;
    if (compare_ckpt->parsed()) return cmd_compare(ckpt_a, ckpt_b);
    if (prepare->parsed()) return cmd_prepare(o, worker, workers, merge_only, verify);
    if (encode_text->parsed())
      return cmd_encode_text(o, text_encoder_dir, tokenizer_path, text_len, captions, embedding_out);
  } catch (const ReplicasDiverged& e) {
    if (e.report) std::fprintf(stderr, "error: %s\n", e.what());
    abort_world(kCorruptionStatus);
    return kCorruptionStatus;
  } catch (const CheckpointUnreadable& e) {
    // Not proof of damage: the checkpoint was left as it is; the same command may succeed later.
    if (!e.reported) std::fprintf(stderr, "error: %s\n", e.what());
    abort_world(kUnreadableCheckpointStatus);
    return kUnreadableCheckpointStatus;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    abort_world(2);  // the other ranks may wait in a collective: end them too
    return 2;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "error (torch): %s\n", e.what_without_backtrace());
    abort_world(2);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    abort_world(2);
    return 2;
  }
  return 1;
}

// One optimizer step, top to bottom, the same for every world size and mesh: learning rate ->
// micro-batches (data, flow-matching noising, caption dropout, forward under autocast, loss
// weighted by the rank's share of the samples, backward with the parallel model's gradient
// reductions around it; a model that keeps its first frame, Wan 2.2 TI2V, sees it clean at
// timestep 0 and learns on the rest) -> global totals -> clip (global norm from the layouts) -> AdamW ->
// EMA, or no update when the gradient norm is not finite (or the step spiked, if so configured:
// spike_response.cpp). The phases are slices of the trace (core/trace.h) when one is recorded.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/gpu_events.h"
#include "core/trace.h"
#include "diffusion/flow_matching.h"
#include "diffusion/frame_condition.h"
#include "model/fp8.h"
#include "core/precision.h"
#include "train/schedule.h"
#include "train/trainer.h"

namespace vidit {

StepResult Trainer::step() {
  trace::Span step_span("step " + std::to_string(step_ + 1), "step");
  const auto t0 = std::chrono::steady_clock::now();
  const double wait0 = mesh_->comm_times().wait_s();
  // On a GPU the step's busy time is measured on the device (core/gpu_events.h): its span on
  // the stream, less the time the stream stood at collectives (waits before this step's are
  // not its own).
  const int gpu = device_.is_cuda() ? std::max<int>(0, device_.index()) : -1;
  if (gpu >= 0) mesh_->take_gpu_stall_s();
  const GpuEventPtr gpu_start = record_gpu_event(gpu);
  const auto& tc = cfg_.train;
  watchdog_->beat("training", step_);
  // (lr_scale_: the back-off after rollbacks, train.rollback_lr_scale.)
  const double lr = lr_scale_ * learning_rate(step_, tc.steps, tc.lr, tc.warmup_steps, tc.schedule, tc.min_lr_ratio);

  for (const auto& [name, p] : pm_->params()) at::Tensor(p).mutable_grad() = at::Tensor();
  if (fp8_casts_) fp8_casts_->clear();  // the weights may have changed since (a load, a fault)
  double loss_sum = 0, flops = 0, data_wait = 0;
  int64_t samples = 0, tokens = 0;
  StepSamples mine;  // each real sample's own loss, sigma and identity (spike detection)
  std::map<std::string, std::pair<double, int64_t>> bucket_losses;
  std::vector<Replay> replay;  // the micro-batches' inputs, for a re-run of a spike
  for (int64_t micro = 0; micro < tc.grad_accum; ++micro) {
    // Data: clean latents x0 and text embeddings for this micro-batch. Every data-parallel rank
    // takes one batch per micro-batch, and its loss is weighted by its share of the samples of
    // all ranks (batch_share: 1 when the batches are equal), so that the averaged gradient is
    // that of the mean over every sample; if no rank has a sample (batches emptied by
    // unreadable samples), all take the next batch.
    MicroBatch mb;
    double share = 1;
    {
      trace::Span span("data", "step");
      const auto d0 = std::chrono::steady_clock::now();
      do {
        mb = data_->next(tc.batch_size);
        share = batch_share(mb);
      } while (share < 0);
      data_wait += std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count();
    }
    at::Tensor x0 = mb.latents.to(at::kFloat);
    const int64_t B = x0.size(0);
    // Random numbers are drawn for the whole global batch (data parallel: this rank keeps its
    // rows), so each sample gets the same ones whatever the number of ranks.
    const int64_t global = mb.global_rows > 0 ? mb.global_rows : B;
    auto rows = [&](const at::Tensor& t) { return global == B ? t : t.narrow(0, mb.row_offset, B); };
    std::vector<int64_t> global_shape = x0.sizes().vec();
    global_shape[0] = global;
    // Cached VAE posteriors: draw the latent, mean + std * noise.
    if (mb.latent_std.defined())
      x0 = x0 + mb.latent_std.to(at::kFloat) * rows(at::randn(global_shape, gen_, at::kFloat));
    // Flow matching: sigma per sample, x_t = (1 - sigma) x0 + sigma eps, target eps - x0.
    // One expert of a two-expert model: only the noise levels it serves (model/experts.h).
    const SigmaRange served = sigma_range(cfg_.train.expert, cfg_.model.boundary);
    at::Tensor sigma = rows(sample_sigmas(global, cfg_.diffusion, gen_, served));
    at::Tensor noise = rows(at::randn(global_shape, gen_, at::kFloat));
    at::Tensor text = drop_text(mb.texts, null_text_, rows(sample_text_keep(global, cfg_.diffusion.text_drop_prob, gen_)));
    if (B > 0) {
      samples += B;
      tokens += B * (x0.size(2) / cfg_.model.patch[0]) * (x0.size(3) / cfg_.model.patch[1]) *
                (x0.size(4) / cfg_.model.patch[2]);
      flops += double(B) * sample_flops(x0);
      last_batch_ = {x0, at::Tensor(), text, 0, 0, {}, mb.condition, mb.image};  // the stand-in of a later idle step
    } else {
      // A rank without samples while others have some computes a stand-in with weight 0, so
      // its collectives match theirs. (Its draws above were of the global batch, or of none.)
      MicroBatch idle = stand_in();
      x0 = idle.latents, text = idle.texts, mb.condition = idle.condition, mb.image = idle.image;
      noise = at::zeros_like(x0), sigma = at::full({x0.size(0)}, 0.5);
    }
    // Pinned host batches (the cache loader on a GPU machine) copy asynchronously.
    auto dev = [&](const at::Tensor& t) { return t.to(device_, t.scalar_type(), /*non_blocking=*/t.is_pinned()); };
    const at::Tensor clean = dev(x0);
    FlowSample fs = make_flow_sample(clean, dev(noise), dev(sigma));
    // Wan 2.2 TI2V: the clip's first latent frame kept clean at timestep 0, the loss on the rest
    // (a clip of one latent frame trains as text-to-video: nothing would be left to learn).
    if (fuses_first_frame(cfg_.model) && clean.size(2) > 1) {
      fs.x_t = keep_first_frame(fs.x_t, clean.narrow(2, 0, 1));
      fs.timestep = first_frame_timesteps(fs.timestep, clean.sizes(), cfg_.model.patch);
    }
    // Image-to-video: the given frames' mask and latent beside the noisy latent, and their CLIP
    // features beside the text (diffusion/frame_condition.h); x_t alone for text-to-video.
    const at::Tensor x_in = with_frame_condition(fs.x_t, mb.condition.defined() ? dev(mb.condition) : at::Tensor());
    const at::Tensor image = mb.image.defined() ? dev(mb.image).to(at::kFloat) : at::Tensor();

    at::Tensor pred;
    {
      trace::Span span("forward", "step");
      AutocastGuard autocast(tc.precision, device_.type());
      pred = pm_->model()->forward(x_in, fs.timestep, dev(text), image);
    }
    at::Tensor loss = flow_loss(loss_frames(pred, cfg_.model), loss_frames(fs.target, cfg_.model));
    const at::Tensor sample_mean = loss.detach();  // the batch's mean loss, read after backward
    if (tap_) tap_->micro_batch(step_ + 1, micro, x_in, fs.timestep, dev(text), fs.target, sample_mean);
    if (tc.spike_action != SpikeAction::off) {
      const std::vector<double> own =
          sample_losses(loss_frames(pred, cfg_.model), loss_frames(fs.target, cfg_.model), B);
      const at::Tensor sig = sigma.to(at::kDouble).cpu().contiguous();
      for (int64_t i = 0; i < B; ++i) {
        mine.loss.push_back(own[size_t(i)]), mine.sigma.push_back(sig.data_ptr<double>()[i]);
        mine.ids.push_back(size_t(i) < mb.ids.size() ? mb.ids[size_t(i)] : "null");
      }
      if (tc.spike_rerun) replay.push_back({x_in, fs.timestep, dev(text), fs.target, image, B});
    }
    if (share != 1) loss = loss * share;
    loss = loss / double(tc.grad_accum);
    // Backward, with the gradient reductions of the parallel model around it (data-parallel
    // buckets launched as the last micro-batch's backward finishes them, FSDP reduce-scatters):
    // after the last micro-batch every rank holds its part of the global batch's gradient.
    const bool last = micro == tc.grad_accum - 1;
    pm_->before_backward(last);
    {
      trace::Span span("backward", "step");
      loss.backward();
    }
    {
      trace::Span span("gradient reduction", "step");
      pm_->after_backward(last);
    }
    loss_sum += loss.item<double>();
    if (B > 0) {
      auto& b = bucket_losses[std::to_string(x0.size(2)) + "x" + std::to_string(x0.size(3)) + "x" +
                              std::to_string(x0.size(4))];
      b.first += sample_mean.item<double>() * double(B), b.second += B;
    }
  }
  // Logged numbers are global: mean loss; samples, tokens and FLOPs summed over the ranks. Over
  // "dp" only: the members of an sp or tensor group computed the same loss on the same samples.
  at::Tensor totals = at::tensor({loss_sum, double(samples), double(tokens), flops}, at::kDouble);
  const auto& dp = mesh_->group("dp");
  dp->all_reduce(totals, ReduceOp::Sum)->wait();
  loss_sum = totals[0].item<double>() / dp->size();
  samples = int64_t(totals[1].item<double>()), tokens = int64_t(totals[2].item<double>());
  flops = totals[3].item<double>();

  if (tap_) tap_->before_clip(step_ + 1, loss_sum, *pm_);
  trace::Span opt_span("clip + optimizer", "step");
  const double grad_norm = pm_->clip_grad_norm(tc.grad_clip);
  // A non-finite gradient (an overflow, a bad sample) would make every weight NaN: the update is
  // skipped instead. The norm is global, so every rank decides the same.
  // A spike (diagnose/spike_detector.h: the loss against its per-sigma baseline, or the norm
  // against its own) is reported with its samples, and skipped when train.spike_action = "skip".
  // With "rollback", fit() then returns to the newest checkpoint, the blamed samples quarantined.
  const SpikeResponse response =
      tc.spike_action == SpikeAction::off ? SpikeResponse{} : judge_spike(mine, replay, grad_norm, step_ + 1);
  const SpikeVerdict& spike = response.verdict;
  const bool skipped = !std::isfinite(grad_norm) || (spike.spike && tc.spike_action != SpikeAction::log);
  if (skipped) {
    ++skipped_in_a_row_;
    VIDIT_CHECK(skipped_in_a_row_ <= tc.max_skipped_steps, "training diverged at step ", step_ + 1, ": ",
                skipped_in_a_row_, " steps in a row had a non-finite gradient norm or a spike (train.max_skipped_steps = ",
                tc.max_skipped_steps, "); lower train.lr or raise train.warmup_steps, and check the data of these steps");
  } else {
    skipped_in_a_row_ = 0;
    opt_->step(lr);
    if (ema_) ema_->update(pm_->params());
  }
  if (fp8_casts_) fp8_casts_->clear();  // not held between steps
  ++step_;
  watchdog_->beat("training", step_);

  // (On a GPU this waits for the step's last kernels, the optimizer's, so that the step's host
  // time covers its device time.)
  double device_busy = -1;
  if (gpu_start) device_busy = gpu_seconds_between(gpu_start, record_gpu_event(gpu));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double wait = mesh_->comm_times().wait_s() - wait0;
  if (gpu_start) device_busy = std::max(0.0, device_busy - mesh_->take_gpu_stall_s());
  return {step_, samples, tokens, flops, loss_sum, grad_norm, lr, secs, wait, data_wait, skipped, spike.spike,
          spike.loss_z, response.rollback, device_busy, std::move(mine.loss), std::move(bucket_losses)};
}

}  // namespace vidit

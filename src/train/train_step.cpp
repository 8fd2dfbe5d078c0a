// One optimizer step, top to bottom: learning rate -> micro-batches (data, flow-matching
// noising, caption dropout, forward under autocast, loss weighted by the rank's share of the
// samples, backward) -> gradient reduction over the data- and sequence-parallel ranks -> clip
// -> AdamW -> EMA. The phases are slices of the trace
// (core/trace.h) when one is recorded.
#include <chrono>

#include "core/trace.h"
#include "diffusion/flow_matching.h"
#include "core/precision.h"
#include "train/schedule.h"
#include "train/trainer.h"

namespace vidit {

StepResult Trainer::step() {
  trace::Span step_span("step " + std::to_string(step_ + 1), "step");
  const auto t0 = std::chrono::steady_clock::now();
  const double wait0 = mesh_ ? mesh_->comm_times().wait_s() : 0;
  const auto& tc = cfg_.train;
  const double lr = learning_rate(step_, tc.steps, tc.lr, tc.warmup_steps, tc.schedule, tc.min_lr_ratio);

  for (auto& p : param_list_) p.mutable_grad() = at::Tensor();
  double loss_sum = 0, flops = 0, data_wait = 0;
  int64_t samples = 0, tokens = 0;
  for (int64_t micro = 0; micro < tc.grad_accum; ++micro) {
    // Data: clean latents x0 and text embeddings for this micro-batch. One process replaces a
    // batch emptied by unreadable samples by the next one. Under data parallel every rank takes
    // one batch per micro-batch, and its loss is weighted by its share of the samples of all
    // ranks (batch_share: 1 when the batches are equal), so that the averaged gradient is that
    // of the mean over every sample; if no rank has a sample, all take the next batch.
    MicroBatch mb;
    double share = 1;
    {
      trace::Span span("data", "step");
      const auto d0 = std::chrono::steady_clock::now();
      do {
        mb = data_->next(tc.batch_size);
        share = mesh_ ? batch_share(mb) : 1;
      } while (mesh_ ? share < 0 : mb.latents.size(0) == 0);
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
    at::Tensor sigma = rows(sample_sigmas(global, cfg_.diffusion, gen_));
    at::Tensor noise = rows(at::randn(global_shape, gen_, at::kFloat));
    at::Tensor text = drop_text(mb.texts, null_text_, rows(sample_text_keep(global, cfg_.diffusion.text_drop_prob, gen_)));
    if (B > 0) {
      samples += B;
      tokens += B * (x0.size(2) / cfg_.model.patch[0]) * (x0.size(3) / cfg_.model.patch[1]) *
                (x0.size(4) / cfg_.model.patch[2]);
      flops += double(B) * sample_flops(x0);
      if (mesh_) last_batch_ = {x0, at::Tensor(), text};  // the stand-in of a later idle step
    } else {
      // A rank without samples while others have some computes a stand-in with weight 0, so
      // its collectives match theirs. (Its draws above were of the global batch, or of none.)
      MicroBatch idle = stand_in();
      x0 = idle.latents, text = idle.texts;
      noise = at::zeros_like(x0), sigma = at::full({x0.size(0)}, 0.5);
    }
    // Pinned host batches (the cache loader on a GPU machine) copy asynchronously.
    auto dev = [&](const at::Tensor& t) { return t.to(device_, t.scalar_type(), /*non_blocking=*/t.is_pinned()); };
    FlowSample fs = make_flow_sample(dev(x0), dev(noise), dev(sigma));

    at::Tensor pred;
    {
      trace::Span span("forward", "step");
      AutocastGuard autocast(tc.precision, device_.type());
      pred = model_->forward(fs.x_t, fs.timestep, dev(text));
    }
    at::Tensor loss = flow_loss(pred, fs.target);
    if (share != 1) loss = loss * share;
    loss = loss / double(tc.grad_accum);
    // Data parallel: the last backward launches the gradient all-reduces as buckets complete.
    if (dp_ && micro == tc.grad_accum - 1) dp_->begin();
    {
      trace::Span span("backward", "step");
      loss.backward();
    }
    if (fsdp_) {
      trace::Span span("gradient reduction", "step");
      fsdp_->after_backward();  // sharded: gradients reduce-scattered into the shards
    }
    loss_sum += loss.item<double>();
  }
  if (dp_) {
    trace::Span span("gradient reduction", "step");
    dp_->finish();  // every rank now holds the gradient of the global batch's mean loss
  }
  if (mesh_) {
    // Logged numbers are global: mean loss; samples, tokens and FLOPs summed over the ranks.
    at::Tensor totals = at::tensor({loss_sum, double(samples), double(tokens), flops}, at::kDouble);
    // Over "dp" only: the members of an sp group computed the same loss on the same samples.
    const auto& dp = mesh_->group("dp");
    dp->all_reduce(totals, ReduceOp::Sum)->wait();
    loss_sum = totals[0].item<double>() / dp->size();
    samples = int64_t(totals[1].item<double>()), tokens = int64_t(totals[2].item<double>());
    flops = totals[3].item<double>();
  }

  trace::Span opt_span("clip + optimizer", "step");
  const double grad_norm = fsdp_ ? fsdp_->clip_grad_norm(tc.grad_clip, tp_.get())
                           : tp_ ? tp_->clip_grad_norm(params_, tc.grad_clip)
                                 : clip_grad_norm(param_list_, tc.grad_clip);
  opt_->step(lr);
  if (ema_) ema_->update(params_);
  ++step_;

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double wait = mesh_ && mesh_->size() > 1 ? mesh_->comm_times().wait_s() - wait0 : -1;
  return {step_, samples, tokens, flops, loss_sum, grad_norm, lr, secs, wait, data_wait};
}

}  // namespace vidit

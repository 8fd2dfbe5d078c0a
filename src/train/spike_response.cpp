// What the trainer does about a spike (diagnose/spike_detector.h), on every rank alike:
//  1. judge: every sample of the global batch (loss, σ, rank; gathered over "dp") against its σ
//     bin's baseline, and the gradient norm against its own; each part of the model's gradient
//     norm against its own (the blocks that jumped);
//  2. re-run (train.spike_rerun): the step's forward passes again on the same ranks, with the
//     same inputs, weights and random numbers. A sample whose loss reproduces carries the spike
//     in its data; one that does not was computed wrongly once (a device's transient error), as
//     Megatron's re-run machinery tells them apart;
//  3. blame: the samples' identities are gathered (only now, 512 bytes each), rank 0 writes
//     forensics/step_N.json and an event; samples blamed for reproduced spikes
//     train.quarantine_after times go to the quarantine (diagnose/quarantine.h), which the loader
//     skips from then on;
//  4. act (train.spike_action): log; skip the update; or roll back — skip it, quarantine the blamed
//     samples (all of the step's when none stands out) at once, and return to the newest good
//     checkpoint (fit() calls roll_back()), at most train.max_rollbacks times, the learning rate
//     scaled by train.rollback_lr_scale after each. A spike the re-run did not reproduce is the
//     device's: its update is skipped (unless "log") but there is nothing to roll back from or
//     to quarantine; the report names the rank and host.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/precision.h"
#include "core/trace.h"
#include "diagnose/forensics.h"
#include "diagnose/rank_hosts.h"
#include "diffusion/flow_matching.h"
#include "diffusion/frame_condition.h"
#include "train/trainer.h"

namespace vidit {

std::vector<double> Trainer::rerun(const std::vector<Replay>& replay) {
  trace::Span span("spike re-run", "step");
  std::vector<double> out;
  {
    at::NoGradGuard ng;
    for (const Replay& r : replay) {
      AutocastGuard autocast(cfg_.train.precision, device_.type());
      const at::Tensor pred = pm_->model()->forward(r.x_t, r.timestep, r.text, r.image);
      const auto& m = cfg_.model;
      for (double x : sample_losses(loss_frames(pred, m), loss_frames(r.target, m), r.samples)) out.push_back(x);
    }
  }
  pm_->after_forward_only();
  return out;
}

Trainer::SpikeResponse Trainer::judge_spike(const StepSamples& mine, const std::vector<Replay>& replay, double grad_norm,
                                            int64_t step) {
  const auto& tc = cfg_.train;
  // Every sample of the global batch, once: gathered over "dp" (the members of an sp or tensor
  // group hold the same samples), padded to the largest count.
  const auto& dp = mesh_->group("dp");
  const int64_t n = int64_t(mine.loss.size());
  at::Tensor cap = at::tensor({double(n)}, at::kDouble);
  dp->all_reduce(cap, ReduceOp::Max)->wait();
  const int64_t c = int64_t(cap.item<double>());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto gather = [&](const std::vector<std::vector<double>>& columns) {  // [dp * c, columns]
    at::Tensor rows = at::full({c, int64_t(columns.size())}, nan, at::kDouble);
    for (size_t k = 0; k < columns.size(); ++k)
      for (int64_t i = 0; i < n && size_t(i) < columns[k].size(); ++i) rows[i][int64_t(k)] = columns[k][size_t(i)];
    at::Tensor all = at::empty({dp->size() * c * int64_t(columns.size())}, at::kDouble);
    dp->all_gather(rows.view(-1), all)->wait();
    return all.view({dp->size() * c, int64_t(columns.size())}).contiguous();
  };
  if (c == 0) {
    spikes_.parts(pm_->grad_norms_by_part(), /*learn=*/true);
    return {};
  }
  const at::Tensor all = gather({mine.loss, mine.sigma, std::vector<double>(size_t(n), double(mesh_->rank()))});
  const double* a = all.data_ptr<double>();
  std::vector<SampleLoss> samples;
  std::vector<StepSample> who;
  std::vector<int64_t> slot;  // position of each sample in the gathered rows
  for (int64_t i = 0; i < dp->size() * c; ++i) {
    if (std::isnan(a[3 * i + 1])) continue;  // padding
    samples.push_back({a[3 * i + 1], a[3 * i]});
    who.push_back({nullptr, int(a[3 * i + 2]), a[3 * i + 1], a[3 * i]});
    slot.push_back(i);
  }
  SpikeResponse out;
  SpikeVerdict& v = out.verdict;
  v = spikes_.observe(samples, grad_norm);
  const std::vector<PartNorm> parts = spikes_.parts(pm_->grad_norms_by_part(), /*learn=*/!v.spike);
  if (!v.spike) return out;

  // The re-run, on every rank (its forward passes are collective as the first ones were).
  const bool reran = tc.spike_rerun && !replay.empty();
  if (reran) {
    const at::Tensor again = gather({rerun(replay)});
    for (size_t k = 0; k < who.size(); ++k) who[k].rerun_loss = again.data_ptr<double>()[slot[k]];
  }
  // Who the samples are: 512 bytes of each id, gathered only now, to every rank (each keeps the
  // same quarantine).
  constexpr int64_t kIdBytes = 512;
  at::Tensor ids = at::zeros({c, kIdBytes / 8}, at::kLong);
  for (int64_t i = 0; i < n && size_t(i) < mine.ids.size(); ++i)
    std::memcpy(static_cast<char*>(ids.data_ptr()) + i * kIdBytes, mine.ids[size_t(i)].data(),
                std::min<size_t>(mine.ids[size_t(i)].size(), kIdBytes - 1));
  at::Tensor all_ids = at::empty({dp->size() * c * (kIdBytes / 8)}, at::kLong);
  dp->all_gather(ids.view(-1), all_ids)->wait();
  const char* bytes = static_cast<const char*>(all_ids.data_ptr());
  for (size_t k = 0; k < who.size(); ++k) {
    const char* id = bytes + slot[k] * kIdBytes;
    who[k].id = nlohmann::json::parse(std::string(id, strnlen(id, kIdBytes)), nullptr, /*allow_exceptions=*/false);
  }

  // The cause: the data when every blamed sample's loss reproduced, the device when one did not.
  const std::vector<size_t> blamed = blamed_samples(v, who, tc.spike_z);
  std::string cause = "unknown";
  nlohmann::json not_reproduced = nlohmann::json::array();
  if (reran) {
    std::vector<int> bad_ranks;
    for (size_t k = 0; k < who.size(); ++k)
      if (!reproduced(who[k]) && std::find(bad_ranks.begin(), bad_ranks.end(), who[k].rank) == bad_ranks.end())
        bad_ranks.push_back(who[k].rank);
    for (int r : bad_ranks) not_reproduced.push_back(rank_and_host(r, hosts_));
    if (!bad_ranks.empty()) cause = "device";
    else if (!blamed.empty()) cause = "data";
  }
  const bool device = cause == "device";
  out.rollback = tc.spike_action == SpikeAction::rollback && !device;
  // The quarantine: blamed samples of a reproduced spike; a rollback's at once (all of the
  // step's samples when none stands out, since the replay would meet them again).
  std::vector<size_t> to_blame = blamed;
  if (out.rollback && to_blame.empty())
    for (size_t k = 0; k < who.size(); ++k) to_blame.push_back(k);
  nlohmann::json quarantined = nlohmann::json::array();
  if (cause == "data" || out.rollback)
    for (size_t k : to_blame)
      if (quarantine_->blame(who[k].id, step, /*now=*/out.rollback)) quarantined.push_back(sample_key(who[k].id));
  if (!quarantined.empty()) data_->skip(quarantine_->quarantined());
  if (!is_lead()) return out;

  nlohmann::json jumped = nlohmann::json::array();
  for (const PartNorm& p : parts) {
    if (jumped.size() >= 8 || p.ratio <= 0) break;
    jumped.push_back({{"part", p.part}, {"grad_norm", p.norm}, {"typical", p.typical}, {"ratio", p.ratio},
                      {"jumped", p.ratio >= 3}});
  }
  const std::string action = name_of(tc.spike_action);
  const nlohmann::json extra = {{"cause", cause},
                                {"rerun", reran},
                                {"not_reproduced_on", not_reproduced},
                                {"parts", jumped},
                                {"quarantined", quarantined},
                                {"rollback", out.rollback}};
  const std::string path = write_forensics(tc.out_dir, step, v, who, grad_norm, tc.spike_z, action, hosts_, extra);
  if (!quarantined.empty()) quarantine_->save();
  const nlohmann::json report = nlohmann::json::parse(std::ifstream(path));
  const std::string blamed_text = describe_blamed(report);
  std::string cause_text = !reran  ? "not re-run"
                           : device ? "it did not reproduce when re-run on " + not_reproduced.dump() + ": the device's error"
                           : cause == "data" ? "it reproduced when re-run: the data's"
                                             : "the losses reproduced when re-run, and no sample stands out";
  const std::string what = out.rollback                         ? "rolling back to the newest checkpoint"
                           : tc.spike_action == SpikeAction::log ? "training goes on"
                                                                 : "the update is skipped";
  std::fprintf(stderr, "spike at step %lld: the %s %s %.1f spreads above its baseline (loss z %.1f, gradient z %.1f); "
                       "blamed: %s; %s; %s%s%s; forensics in %s\n",
               (long long)step, v.why.c_str(), v.why.find(" and ") != std::string::npos ? "are" : "is",
               std::max(v.loss_z, v.grad_z), v.loss_z, v.grad_z, blamed_text.c_str(), cause_text.c_str(), what.c_str(),
               quarantined.empty() ? "" : "; quarantined: ", quarantined.empty() ? "" : quarantined.dump().c_str(),
               path.c_str());
  events().write("spike", step, {{"why", v.why}, {"loss_z", v.loss_z}, {"grad_z", v.grad_z}, {"action", action},
                                 {"cause", cause}, {"not_reproduced_on", not_reproduced}, {"blamed", report.at("blamed")},
                                 {"quarantined", quarantined}, {"forensics", path}});
  return out;
}

bool Trainer::roll_back(int64_t step) {
  const auto& tc = cfg_.train;
  VIDIT_CHECK(quarantine_->rollbacks() < tc.max_rollbacks, "step ", step, " spiked and the run has rolled back ",
              quarantine_->rollbacks(), " times already (train.max_rollbacks = ", tc.max_rollbacks,
              "); stopping. See ", tc.out_dir, "/forensics and `vidit doctor ", tc.out_dir, "`");
  finish_save();  // a save in flight commits first: it holds a state from before the spike
  const int64_t from = step_;
  if (!resume()) {
    if (is_lead())
      std::fprintf(stderr, "rollback: no checkpoint yet to return to; the update of step %lld was skipped and "
                           "training goes on\n", (long long)step);
    return false;
  }
  quarantine_->add_rollback(from, step_);
  lr_scale_ = std::pow(tc.rollback_lr_scale, double(quarantine_->rollbacks()));
  if (!is_lead()) return true;
  quarantine_->save();
  std::fprintf(stderr, "rollback %lld of at most %lld: back to step %lld; %zu sample(s) quarantined; learning rate x %.3g\n",
               (long long)quarantine_->rollbacks(), (long long)tc.max_rollbacks, (long long)step_,
               quarantine_->quarantined().size(), lr_scale_);
  events().write("rollback", from, {{"to", step_}, {"rollbacks", quarantine_->rollbacks()}, {"lr_scale", lr_scale_},
                                    {"quarantined", quarantine_->quarantined().size()}});
  return true;
}

}  // namespace vidit

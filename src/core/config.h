// Typed configuration for every part of vidit. The defaults are the embedded demo (a tiny DiT
// on the demo codec's latents), so `vidit demo` needs no file.
//
// Each key is declared once, below, in its section's list: type, name, default, check and a
// one-line doc. Everything else is derived from that line (config.cpp): the struct field,
// reading it from TOML (type-checked), `--set section.key=value` overrides, refusing unknown keys
// with the closest known one suggested, the check, writing the resolved config with toml++'s own
// serializer, and the reference `vidit keys` prints (docs/CONFIG.md). Choices from a fixed set
// are enums, checked when the file is read. Relations between keys (dim divisible by heads, the
// demo codec's shapes, ...) are checked by validate_config().
#pragma once
#include <array>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace vidit {

// ---- choices ----------------------------------------------------------------------------------
// Each enum's TOML spellings, in the order of its values (EnumNames<E>::names): the enumerators'
// names, except `automatic`, spelled "auto" (a C++ keyword).
template <class E>
struct EnumNames;
std::vector<std::string> enum_spellings(std::string_view enumerators);  // "a, b, c" -> {"a", "b", "c"}

#define VIDIT_CONFIG_ENUM(Name, ...)                                            \
  enum class Name { __VA_ARGS__ };                                              \
  template <>                                                                   \
  struct EnumNames<Name> {                                                      \
    static const std::vector<std::string>& names() {                            \
      static const std::vector<std::string> n = enum_spellings(#__VA_ARGS__);   \
      return n;                                                                 \
    }                                                                           \
  };

// data.source: generated shape videos, random latents, or a latent cache (`vidit prepare`).
VIDIT_CONFIG_ENUM(DataSource, demo, synthetic, cache)
// model.condition: text only, or the frames an image-to-video model is conditioned on
// (diffusion/frame_condition.h).
VIDIT_CONFIG_ENUM(FrameCondition, none, first_frame, first_last_frame)
// train.expert: which expert of a two-expert model (model.boundary > 0) a run trains, by noise
// level (model/experts.h); none: a one-model run.
VIDIT_CONFIG_ENUM(Expert, none, high, low)
// data.codec: the lossless demo codec, the Wan 2.1 VAE, or the Wan 2.2 VAE.
VIDIT_CONFIG_ENUM(Codec, demo, wan_vae, wan22_vae)
// data.text_encoder: the built-in caption embedder, or files the manifest names.
VIDIT_CONFIG_ENUM(TextEncoder, demo, precomputed)
// data.decoder: NVDEC when a GPU is there (else software), software, or NVDEC.
VIDIT_CONFIG_ENUM(Decoder, automatic, cpu, nvdec)
// train.device, data.encode_device: CUDA when present (else the CPU), the CPU, or CUDA.
VIDIT_CONFIG_ENUM(DeviceChoice, automatic, cpu, cuda)
// train.precision (all four), parallel.reduce_dtype and data.cache_dtype (fp32 and bf16).
VIDIT_CONFIG_ENUM(Precision, fp32, bf16, fp8, fp8_rowwise)
// train.attention_backend: which fused scaled-dot-product attention kernel runs.
VIDIT_CONFIG_ENUM(AttentionBackend, automatic, math, flash, efficient, cudnn)
// faults.kind: what the fault injection does (resilience/fault_injection.h).
VIDIT_CONFIG_ENUM(FaultKind, none, exit, kill, sigterm, hang, slow, nan_grad, bitflip, corrupt_checkpoint,
                  truncate_checkpoint, disk_full, io_error, slow_storage, kill_in_save, poison_sample, glitch,
                  poison_cache, load_io_error, load_permission, load_no_memory, crash_in_commit)
// train.recompute_policy: what a recomputed block keeps (model/recompute.h).
VIDIT_CONFIG_ENUM(RecomputePolicy, block, selective)
// train.spike_action: what a loss or gradient spike does (diagnose/spike_detector.h).
VIDIT_CONFIG_ENUM(SpikeAction, off, log, skip, rollback)
// train.schedule after warm-up.
VIDIT_CONFIG_ENUM(Schedule, cosine, constant)
// diffusion.timestep_sampling of sigma.
VIDIT_CONFIG_ENUM(TimestepSampling, uniform, logit_normal)
// sample.solver: UniPC multistep (Wan's default) or Euler, both on the flow-matching sigmas.
VIDIT_CONFIG_ENUM(Solver, unipc, euler)
// data.balance: what each step's per-rank batches are made equal in (loader/bucket_sampler.h).
VIDIT_CONFIG_ENUM(Balance, tokens, cost)
// data.on_change: what `vidit prepare` does with cached clips made with other encode settings.
VIDIT_CONFIG_ENUM(OnChange, stop, reencode)
// data.source_identity: how a cached clip's source video is known again (prepare/provenance.h).
VIDIT_CONFIG_ENUM(SourceIdentity, stat, content)
#undef VIDIT_CONFIG_ENUM

// The spelling of an enum value ("auto" for `automatic`), and the value of a spelling.
template <class E>
const std::string& name_of(E e) {
  return EnumNames<E>::names()[size_t(e)];
}
template <class E>
std::ostream& operator<<(std::ostream& os, E e)
  requires requires { EnumNames<E>::names(); }
{
  return os << name_of(e);
}

using Patch = std::array<int64_t, 3>;
using IntList = std::vector<int64_t>;
using NumList = std::vector<double>;
using StrList = std::vector<std::string>;

// ---- the keys ---------------------------------------------------------------------------------
// KEY(type, name, default, check, doc). Checks: any, positive, non_negative, fraction ([0, 1]),
// below_one ([0, 1)), block_count (>= -1), even_positive, fp32_or_bf16, fp32_bf16_or_fp8.

#define VIDIT_MODEL_KEYS(KEY)                                                                          \
  KEY(int64_t, dim, 128, positive, "hidden size of every block")                                       \
  KEY(int64_t, ffn_dim, 256, positive, "MLP hidden size")                                              \
  KEY(int64_t, heads, 4, positive, "attention heads; dim % heads == 0, head_dim even")                 \
  KEY(int64_t, layers, 4, positive, "number of DiT blocks")                                            \
  KEY(int64_t, in_channels, 12, positive, "latent channels in (demo codec: 3*2*2)")                    \
  KEY(int64_t, out_channels, 12, positive, "latent channels predicted")                                \
  KEY(Patch, patch, (Patch{2, 2, 2}), positive, "(t, h, w) patch of the Conv3d embedding")             \
  KEY(int64_t, text_dim, 32, positive, "width of the text embeddings fed in (umT5: 4096)")             \
  KEY(int64_t, text_len, 8, positive, "text tokens; shorter captions are zero-padded (Wan: 512)")      \
  KEY(int64_t, freq_dim, 256, even_positive, "sinusoidal timestep embedding width")                    \
  KEY(double, eps, 1e-6, positive, "LayerNorm / RMSNorm epsilon")                                      \
  KEY(double, rope_theta, 100.0, positive, "RoPE base (Wan: 10000; the demo's small grid wants faster angles)") \
  KEY(int64_t, image_dim, 0, non_negative,                                                             \
      "image-to-video: width of the CLIP image features attended beside the text (Wan 2.1 I2V: 1280, "  \
      "with in_channels = 36: the noisy latent, a 4-channel mask and the condition's latent); 0 = none") \
  KEY(int64_t, image_pos_tokens, 0, non_negative,                                                      \
      "first-and-last-frame models: a learned position embedding over this many image tokens (Wan "    \
      "FLF2V: 514, two images of 257); 0 = none")                                                   \
  KEY(FrameCondition, condition, FrameCondition::none, any,                                            \
      "image-to-video: the frames given as a condition, \"first_frame\" (Wan I2V) or \"first_last_frame\" " \
      "(FLF2V); the model then takes in_channels = 2 * out_channels + 4: the noisy latent, a mask of "  \
      "the given frames at the VAE's 4-frame stride, and the latent of those frames with zeros between") \
  KEY(double, boundary, 0.0, below_one,                                                                \
      "two experts split by noise level (Wan 2.2 A14B): the noise level sigma (timestep / 1000, after the " \
      "shift) at and above which the high-noise expert runs, the low-noise one below it (Wan 2.2: 0.875 "  \
      "text-to-video, 0.9 image-to-video; a release's boundary_ratio); 0 = one model (model/experts.h)")

#define VIDIT_DATA_KEYS(KEY)                                                                           \
  KEY(DataSource, source, DataSource::demo, any,                                                       \
      "\"demo\" (generated shape videos), \"synthetic\" (random latents) or \"cache\" (a latent cache "  \
      "written by `vidit prepare`, read in bucketed token-budget batches)")                            \
  KEY(int64_t, latent_frames, 6, positive,                                                             \
      "latent frames of one sample (with source = \"cache\" the buckets decide; this sizes `vidit info`)") \
  KEY(int64_t, latent_height, 8, positive, "latent height of one sample")                              \
  KEY(int64_t, latent_width, 8, positive, "latent width of one sample")                                \
  KEY(std::string, manifest, "", any,                                                                 \
      "vidit prepare: a .jsonl / .csv manifest, a folder of videos + .txt captions, or WebDataset shards " \
      "(a .tar, a brace pattern such as shards/{00000..00999}.tar, or a .txt list of them)")           \
  KEY(std::string, cache_dir, "", any, "where the latent cache is written and read")                   \
  KEY(Codec, codec, Codec::demo, any,                                                                 \
      "\"demo\" (lossless space-to-depth), \"wan_vae\" (Wan 2.1 VAE: 16 channels, 4x8x8) or \"wan22_vae\" " \
      "(Wan 2.2 VAE: 48 channels, 4x16x16; buckets.multiple a multiple of 16)")                        \
  KEY(std::string, vae_weights, "", any,                                                               \
      "the VAE of data.codec: for \"wan_vae\" a .safetensors file in official or diffusers names, a vae/ " \
      "folder or a diffusers pipeline root (vae/vae_layout.h); for \"wan22_vae\" a vae/ folder with its "  \
      "config.json, or a pipeline root")                                                                 \
  KEY(std::string, image_encoder, "", any,                                                             \
      "image-to-video with CLIP features (model.image_dim > 0): the encoder `vidit prepare` runs on each " \
      "clip's first frame, a transformers CLIPVisionModel folder or a diffusers pipeline root (its "     \
      "image_encoder/ and image_processor/)")                                                            \
  KEY(TextEncoder, text_encoder, TextEncoder::demo, any,                                               \
      "\"demo\" (built-in caption embedder) or \"precomputed\" (files the manifest names)")           \
  KEY(Decoder, decoder, Decoder::automatic, any, "\"auto\" (NVDEC when a GPU is there, else CPU), \"cpu\", \"nvdec\"") \
  KEY(double, fps, 0.0, non_negative, "resample clips to this frame rate; 0 keeps the source rate")   \
  KEY(int64_t, decode_threads, 0, non_negative, "FFmpeg decode threads per clip; 0 = auto")            \
  KEY(bool, square_pixels, true, any, "stretch non-square-pixel (anamorphic) video to square pixels")  \
  KEY(DeviceChoice, encode_device, DeviceChoice::automatic, any,                                       \
      "where the VAE encodes: \"auto\" (CUDA when present), \"cpu\", \"cuda\"")                        \
  KEY(int64_t, shard_mb, 1024, positive, "cache shard size (MiB)")                                     \
  KEY(Precision, cache_dtype, Precision::bf16, fp32_or_bf16, "storage of latent mean / std: \"bf16\" or \"fp32\"") \
  KEY(int64_t, token_budget, 0, non_negative, "tokens per batch per rank; 0 = batch_size x tokens of data.latent_*") \
  KEY(int64_t, loader_threads, 2, positive, "background threads assembling batches")                   \
  KEY(int64_t, prefetch, 4, positive, "batches prepared ahead")                                        \
  KEY(Balance, balance, Balance::tokens, any,                                                          \
      "what each step's per-rank batches are made equal in: \"tokens\" (data.token_budget) or \"cost\" "  \
      "(predicted compute: the projections' and MLP's cost per token plus attention's per token squared, " \
      "from the model's shape; loader/cost_model.h)")                                                   \
  KEY(double, clip_seconds, 0.0, non_negative,                                                         \
      "vidit prepare: cut each video into clips of this many seconds (each cached with its source and " \
      "time range); 0 = one clip per video (from its start, or the manifest's start / end)")          \
  KEY(double, clip_stride_seconds, 0.0, non_negative,                                                  \
      "seconds between the starts of a video's consecutive clips; 0 = data.clip_seconds (back to back)") \
  KEY(int64_t, max_clips_per_video, 100, positive, "at most this many clips from one video (spread over it)") \
  KEY(bool, split_scenes, false, any,                                                                  \
      "vidit prepare: find hard cuts in the decoded low-resolution frames and make no clip that crosses one") \
  KEY(double, scene_threshold, 0.5, fraction,                                                          \
      "a cut is where consecutive frames' luma histograms differ by more than this (total variation distance, 0..1)") \
  KEY(OnChange, on_change, OnChange::stop, any,                                                        \
      "vidit prepare, when cached clips of the manifest were made with other settings (data.codec, "   \
      "data.vae_weights, data.fps, data.cache_dtype, data.square_pixels, [buckets]): \"stop\" names them " \
      "and changes nothing; \"reencode\" encodes those clips again with this run's settings")          \
  KEY(SourceIdentity, source_identity, SourceIdentity::stat, any,                                      \
      "how vidit prepare knows a source video again: \"stat\" (its path under the manifest's folder, "  \
      "size and modification time) or \"content\" (also a hash of its bytes, taken when it is encoded; " \
      "a file whose time changed is read again and is the same video when its bytes are)")                                                        \
  KEY(double, val_fraction, 0.0, fraction,                                                             \
      "validation: this part of data.cache_dir's clips is held out of training, chosen by a hash of each " \
      "clip's key (the same split for every rank, world size and restart; a clip added later falls on its " \
      "side without moving others); 0 = none")                                                          \
  KEY(std::string, val_cache, "", any,                                                                 \
      "validation: a latent cache of its own (written by vidit prepare for held-out videos) evaluated "  \
      "instead of a part of data.cache_dir; \"\" = none")

// Bucket shapes (src/loader/buckets.h): resolution tiers x aspect ratios x frame counts, in
// pixels and video frames (before the VAE). The defaults are the demo's (16x16 and 16x20 pixels,
// 6 frames, demo codec); configs/wan2.1-*.toml show buckets for real data.
#define VIDIT_BUCKET_KEYS(KEY)                                                                         \
  KEY(IntList, resolutions, (IntList{16, 18}), positive, "tiers: sqrt(height * width) targets")        \
  KEY(NumList, aspect_ratios, (NumList{1.0, 1.25}), positive, "width / height")                        \
  KEY(IntList, frames, (IntList{6}), positive, "frame counts, each 1 mod frame_stride")                \
  KEY(int64_t, frame_stride, 1, positive, "4: 4k+1 frames (Wan VAE); 1: any count (demo codec)")       \
  KEY(int64_t, multiple, 4, positive, "height and width are multiples of this")                        \
  KEY(double, max_upscale, 1.0, positive, "largest allowed scale-up factor (1: never upscale)")

#define VIDIT_DIFFUSION_KEYS(KEY)                                                                      \
  KEY(TimestepSampling, timestep_sampling, TimestepSampling::logit_normal, any, "\"uniform\" or \"logit_normal\"") \
  KEY(double, logit_mean, 0.0, any, "mean of the logit-normal sigma distribution")                     \
  KEY(double, logit_std, 1.0, positive, "std of the logit-normal sigma distribution")                  \
  KEY(double, shift, 3.0, positive, "sigma' = s*sigma / (1 + (s-1)*sigma)")                            \
  KEY(double, text_drop_prob, 0.1, fraction, "probability of the null text for classifier-free guidance")

#define VIDIT_TRAIN_KEYS(KEY)                                                                          \
  KEY(int64_t, steps, 12000, positive, "optimizer steps")                                              \
  KEY(int64_t, batch_size, 12, positive, "samples per micro-batch (the global batch over data-parallel ranks)") \
  KEY(int64_t, grad_accum, 1, positive, "micro-batches per optimizer step")                            \
  KEY(double, lr, 2e-3, positive, "peak learning rate")                                                \
  KEY(double, min_lr_ratio, 0.1, fraction, "cosine floor as a fraction of lr")                        \
  KEY(int64_t, warmup_steps, 100, non_negative, "linear warm-up steps")                                \
  KEY(Schedule, schedule, Schedule::cosine, any, "\"cosine\" or \"constant\" after warm-up")           \
  KEY(double, weight_decay, 0.01, non_negative, "AdamW decay (never on norms, biases, modulation)")    \
  KEY(double, beta1, 0.9, below_one, "AdamW beta1")                                                    \
  KEY(double, beta2, 0.99, below_one, "AdamW beta2")                                                   \
  KEY(double, adam_eps, 1e-8, positive, "AdamW epsilon")                                               \
  KEY(double, grad_clip, 1.0, non_negative, "global-norm clip; 0 disables")                            \
  KEY(int64_t, max_skipped_steps, 5, non_negative,                                                        \
      "steps in a row with a non-finite gradient norm that are skipped (no update) before the run stops") \
  KEY(double, ema_decay, 0.999, below_one, "EMA of the weights; 0 disables")                           \
  KEY(uint64_t, seed, 0, any, "seeds init, data order, noise and timesteps")                           \
  KEY(Precision, precision, Precision::fp32, any,                                                      \
      "\"fp32\", \"bf16\" (autocast matmuls; fp32 norms, modulation, RoPE), or bf16 with the blocks' "   \
      "projections in FP8: \"fp8\" (one scale per tensor) or \"fp8_rowwise\" (per row; model/fp8.h)")    \
  KEY(bool, fp8_fast_accum, true, any,                                                                 \
      "FP8: the forward's scaled matmuls accumulate in the tensor cores' fast mode (use_fast_accum); the "  \
      "gradients' never do")                                                                             \
  KEY(bool, fp8_reuse_casts, true, any,                                                                \
      "FP8: each projection weight is cast to e4m3 once per step (the forward, a recomputed forward and " \
      "backward read that cast; 1 byte a weight held for the step) and an input once for the projections " \
      "that share it (q, k, v); false: cast at every use. Not for weights FSDP shards without "          \
      "parallel.fp8_all_gather")                                                                         \
  KEY(AttentionBackend, attention_backend, AttentionBackend::automatic, any,                           \
      "SDPA kernel: \"auto\" (PyTorch picks), \"flash\", \"cudnn\", \"efficient\" or \"math\"; "           \
      "the one that runs is logged (model/attention_backend.h)")                                        \
  KEY(DeviceChoice, device, DeviceChoice::automatic, any,                                              \
      "\"auto\" (CUDA when present), \"cpu\" or \"cuda\" (GPU = LOCAL_RANK)")                           \
  KEY(std::string, out_dir, "runs/demo", any, "checkpoints, metrics.jsonl, samples")                  \
  KEY(int64_t, log_every, 50, positive, "steps between log lines")                                     \
  KEY(int64_t, val_every, 500, non_negative,                                                           \
      "the validation loss (data.val_fraction or data.val_cache) every this many steps and at the end: "   \
      "the live weights' flow-matching loss on the held-out clips at train.val_sigmas with fixed noise, "  \
      "to metrics.jsonl and TensorBoard; 0: off")                                                        \
  KEY(NumList, val_sigmas, (NumList{0.1, 0.3, 0.5, 0.7, 0.9}), positive,                               \
      "validation: the noise levels sigma (timestep / 1000, as given: no shift) every held-out clip is " \
      "evaluated at, each its own band")                                                                \
  KEY(int64_t, val_samples, 64, positive,                                                              \
      "validation: at most this many held-out clips, the same ones every time (the first by a hash of "  \
      "the key)")                                                                                        \
  KEY(double, host_memory_gb, 0.0, non_negative,                                                       \
      "host memory of a node the run may use, GB; 0: the node's MemTotal. A run whose memory plan "       \
      "(vidit plan: its ranks on the node x each one's peak phase) needs more is refused at start")     \
  KEY(SpikeAction, spike_action, SpikeAction::log, any,                                               \
      "a step whose loss (against a baseline per sigma bin) or gradient norm is train.spike_z spreads "    \
      "high: \"log\" (events.jsonl, forensics/step_N.json), \"skip\" (and no update), \"rollback\" "      \
      "(no update; back to the newest checkpoint, its blamed samples quarantined), \"off\"")                 \
  KEY(bool, spike_rerun, true, any,                                                                    \
      "re-run a flagged step's forward pass on the same ranks: a loss that reproduces is the data's, one "  \
      "that does not is the hardware's")                                                                   \
  KEY(int64_t, quarantine_after, 2, non_negative,                                                      \
      "a sample blamed for this many spikes that reproduced goes to <out_dir>/quarantine.json, which the " \
      "loader skips from then on (rollback: at once); 0: never")                                          \
  KEY(int64_t, max_rollbacks, 3, non_negative, "rollbacks (train.spike_action = \"rollback\") before the run stops") \
  KEY(double, rollback_lr_scale, 1.0, positive,                                                        \
      "the learning rate is multiplied by this after each rollback (e.g. 0.5; 1: unchanged)")            \
  KEY(double, spike_z, 6.0, positive, "spike threshold, in spreads of the running baseline")            \
  KEY(int64_t, spike_bins, 8, positive, "sigma bins of the per-sample loss baseline")                 \
  KEY(int64_t, spike_warmup, 8, positive, "samples a sigma bin (steps: the gradient norm) sees before it judges") \
  KEY(bool, tensorboard, true, any,                                                                   \
      "rank 0 writes TensorBoard event files under <out_dir>/tb/ (tensorboard --logdir <out_dir>/tb): every "  \
      "logged step's scalars, rank 0's per-sample losses as a histogram, skipped steps and spikes, each save's " \
      "pause and write seconds, the resolved config as text; a resumed run adds a file and never rewrites a step") \
  KEY(bool, preflight, false, any,                                                                    \
      "run the vidit health checks before training; an unhealthy host stops the job (exit 3)")          \
  KEY(int64_t, replica_check_every, 100, non_negative,                                                 \
      "compare the weights of replicas bit for bit every this many steps and before every save "          \
      "(silent data corruption; exit 87); 0: off")                                                        \
  KEY(double, straggler_threshold, 0.7, below_one,                                                    \
      "a rank whose score (median busy time over ranks / its own) stays below this is a straggler")    \
  KEY(int64_t, straggler_patience, 3, positive, "logged steps in a row below the threshold before it is reported") \
  KEY(int64_t, straggler_exclude_steps, 50, non_negative,                                             \
      "logged steps in a row a rank stays a straggler before its host goes to the exclude list; 0: never") \
  KEY(int64_t, exclude_after_crashes, 2, non_negative,                                               \
      "attempts a host's rank died in (no exit, no signal: killed, crashed) before it goes to the exclude " \
      "list; 0: never")                                                                                \
  KEY(std::string, exclude_file, "", any,                                                             \
      "the exclude list of hosts (train.preflight, stragglers, crashes; one name per line, for srun / "  \
      "sbatch --exclude); \"\": <out_dir>/exclude_hosts.txt")                                             \
  KEY(double, stall_timeout_s, 1800.0, non_negative,                                                   \
      "a rank that makes no progress (no step, no load) for this long ends itself (exit 86); 0: off")   \
  KEY(double, stall_steps, 20.0, non_negative,                                                         \
      "in training, a rank with no progress for this many median step times ends itself sooner, naming the " \
      "ranks that did not arrive (at least train.stall_min_s; 0: only train.stall_timeout_s)")            \
  KEY(double, stall_min_s, 120.0, non_negative, "the shortest limit train.stall_steps may give")        \
  KEY(int64_t, threads, 0, non_negative, "intra-op threads; 0 = all cores")                            \
  KEY(double, peak_tflops, 0.0, non_negative, "per device, for MFU; 0 = from the GPU's name (core/peak_flops.h)") \
  KEY(int64_t, recompute_blocks, 0, block_count,                                                       \
      "activation checkpointing: recompute the first N blocks in backward; -1 = all")                  \
  KEY(RecomputePolicy, recompute_policy, RecomputePolicy::block, any,                                   \
      "what the recomputed blocks keep: \"block\" (only the input; the whole forward runs again) or "  \
      "\"selective\" (also the attention's inputs and output: attention is not run again)")             \
  KEY(double, memory_budget_gb, 0.0, non_negative,                                                     \
      "device memory per rank (GiB, as vidit plan counts it, with a block's activations measured on the " \
      "run's device at start) that activation checkpointing must fit: blocks are recomputed selectively, " \
      "then whole, as few as fit; 0 = train.recompute_blocks / _policy by hand")                      \
  KEY(int64_t, trace_steps, 0, non_negative,                                                           \
      "write a Chrome trace of this many steps (after the first) to <out_dir>/trace/rank<R>.json")     \
  KEY(int64_t, profile_steps, 0, non_negative,                                                         \
      "profile this many steps (after the first) with LibTorch's Kineto profiler: <out_dir>/profile/rank<R>.json " \
      "(ATen ops; CUDA kernels, NCCL and memory on a GPU; our steps, phases, blocks and collective waits as " \
      "annotations; ui.perfetto.dev), and the time by category (matmul, attention, elementwise, "       \
      "communication, idle) in the log and profile/summary_rank<R>.json (diagnose/profile.h)")         \
  KEY(std::string, init_from, "", any,                                                                 \
      "weights to start from: a .safetensors file or a folder of shards (e.g. Wan 2.1); \"\" = random init") \
  KEY(Expert, expert, Expert::none, any,                                                               \
      "two-expert models (model.boundary > 0): \"high\" trains the high-noise expert on the noise levels " \
      "at and above the boundary only, \"low\" the low-noise one below it (from a two-expert release in "  \
      "train.init_from, that expert's weights); \"none\": a one-model run")

// [checkpoint]: when saves come, how they are written, how many are kept (checkpoint/checkpointer.h).
// (Read from the train.ckpt_* / train.keep_* keys of older configs too, with a warning.)
#define VIDIT_CHECKPOINT_KEYS(KEY)                                                                     \
  KEY(int64_t, every, 0, non_negative, "steps between checkpoints; 0: only at the end")                \
  KEY(double, every_minutes, 0.0, non_negative,                                                        \
      "also checkpoint when this many minutes passed since the last save (rank 0's clock); 0: off")    \
  KEY(bool, async, true, any,                                                                          \
      "training pauses only to copy its state to host memory; a background thread writes it")          \
  KEY(int64_t, snapshots, 2, non_negative,                                                             \
      "sets of host buffers for this rank's part of the state, allocated and touched when training "      \
      "starts (pinned on a GPU): 2, a save may start while the previous one is written; 1, a save first "  \
      "waits for the previous one; 0, none: each save is written from the live state before training "    \
      "goes on (checkpoint.async has no effect)")                                                          \
  KEY(double, timeout_s, 1800.0, positive,                                                             \
      "a rank's write of its part that has not ended by then (a storage that hangs) stops the run, "      \
      "which then resumes from the newest good checkpoint")                                                \
  KEY(int64_t, failures_max, 3, positive, "consecutive failed saves after which the run stops")        \
  KEY(int64_t, keep, 2, positive, "newest checkpoints kept on disk")                                   \
  KEY(int64_t, keep_every, 0, non_negative, "also keep every checkpoint whose step is a multiple of this; 0: none")

#define VIDIT_SAMPLE_KEYS(KEY)                                                                         \
  KEY(Solver, solver, Solver::euler, any,                                                              \
      "\"euler\" or \"unipc\" (UniPC multistep, order 2, bh2, flow prediction: Wan's sampler), from sigma = 1 to 0") \
  KEY(int64_t, steps, 30, positive, "solver steps from sigma = 1 to 0 (Wan: 50)")                     \
  KEY(double, shift, 3.0, positive, "sigma schedule shift at sampling (Wan: 3.0 at 480p, 5.0 at 720p)") \
  KEY(double, cfg_scale, 5.0, any, "classifier-free guidance scale; 1 disables")                       \
  KEY(std::string, negative_prompt, "", any,                                                           \
      "the prompt guidance steers away from; \"\": the null (empty-prompt) embedding (the Wan configs set Wan's own)") \
  KEY(double, fps, 16.0, positive, "frame rate of the videos written (Wan 2.1: 16)")                   \
  KEY(uint64_t, seed, 1, any, "seed of the sampled noise")                                             \
  KEY(int64_t, every, 0, non_negative,                                                                 \
      "during `vidit train`: sample every N steps and at the last one, with the EMA weights, to "        \
      "<out_dir>/samples/step_N/*.mp4 and TensorBoard images (pipeline/training_samples.h); 0 = off")      \
  KEY(StrList, prompts, {}, any,                                                                       \
      "captions sampled during training (needs text.encoder or data.text_encoder = \"demo\"); empty: "   \
      "sample.count captions of the cache, each with its cached embedding at its own bucket's size")      \
  KEY(int64_t, count, 4, positive, "with sample.prompts empty: how many of the cache's captions to sample") \
  KEY(Precision, dtype, Precision::fp32, fp32_or_bf16,                                                 \
      "the DiT's weights while sampling: \"fp32\", or \"bf16\" (half the memory; the compute is bf16 autocast either way on a GPU, and on the CPU too with bf16)") \
  KEY(double, cfg_scale_2, 0.0, non_negative,                                                          \
      "two-expert models: the low-noise expert's guidance scale (Wan 2.2 T2V A14B: 3.0 beside cfg_scale 4.0); " \
      "0 = sample.cfg_scale")                                                                           \
  KEY(bool, cfg_parallel, true, any,                                                                   \
      "sampling on an even number of ranks with guidance: the prompt's and the negative prompt's passes on two halves of the ranks (pipeline/sampling_ranks.h)")

// Low-rank adapters (model/lora.h): fine-tuning that trains small matrices beside the blocks'
// frozen projections (usually from train.init_from). rank 0: off.
#define VIDIT_LORA_KEYS(KEY)                                                                           \
  KEY(int64_t, rank, 0, non_negative,                                                                  \
      "adapter rank r: each targeted projection W gets A [r, in] and B [out, r]; 0 = no LoRA (every weight trains)") \
  KEY(double, alpha, 0.0, non_negative, "the adapters add (alpha / rank) B A x; 0 = rank (a scale of 1)") \
  KEY(double, dropout, 0.0, below_one, "dropout on the adapters' input while training")                 \
  KEY(StrList, targets,                                                                                \
      (StrList{"self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q", "cross_attn.k", \
               "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2"}),                                      \
      any,                                                                                             \
      "the blocks' projections that get adapters: blocks.N.<path> matches a target equal to it or ending in " \
      "\".\" + the target (\"q\" matches both attentions' q; \"ffn.0\" every block's first MLP layer)")    \
  KEY(Precision, base_dtype, Precision::fp32, fp32_bf16_or_fp8,                                        \
      "storage of the frozen weights of the targeted projections: \"fp32\", \"bf16\" (half their memory) " \
      "or \"fp8\" (a quarter: e4m3 with a scale per output row, multiplied as fp32)")

// The umT5 text encoder (src/text/): captions to the DiT's context, in C++.
#define VIDIT_TEXT_KEYS(KEY)                                                                           \
  KEY(std::string, encoder, "", any,                                                                   \
      "umT5 encoder weights: a Hugging Face / diffusers text_encoder folder (config.json and safetensors, " \
      "sharded with an index) or a diffusers pipeline folder; \"\" = no umT5 (data.text_encoder decides)") \
  KEY(std::string, tokenizer, "", any,                                                                 \
      "SentencePiece model (spiece.model) or tokenizer.json, or a folder holding one; \"\" = found beside " \
      "text.encoder (its folder, or the pipeline's tokenizer/)")                                         \
  KEY(Precision, dtype, Precision::bf16, fp32_or_bf16, "the encoder's weights and compute: \"bf16\" or \"fp32\"") \
  KEY(DeviceChoice, device, DeviceChoice::automatic, any, "where the encoder runs: \"auto\" (CUDA when present), \"cpu\", \"cuda\"") \
  KEY(int64_t, batch_size, 16, positive, "captions encoded together (sorted by length, so a batch pads little)")

#define VIDIT_DEMO_KEYS(KEY)                                                                           \
  KEY(int64_t, videos, 192, positive, "training clips generated")                                      \
  KEY(int64_t, frame_size, 16, positive, "training frame size in pixels (square), after center crop")  \
  KEY(int64_t, frames, 6, positive, "training frames per clip")                                        \
  KEY(int64_t, codec_block, 2, positive, "space-to-depth block of the lossless demo codec")            \
  KEY(int64_t, text_dim, 32, positive, "width of the built-in caption embedder")                       \
  KEY(int64_t, samples_per_prompt, 4, positive, "generated videos per held-out prompt in the check")   \
  KEY(int64_t, eval_every, 0, non_negative, "also check held-out adherence every N training steps; 0: at the end only") \
  KEY(double, colourless_captions, 0.0, fraction, "fraction of training clips captioned without their colour")

// How the processes of a run are arranged (src/parallel/mesh.h): a mesh of degrees replicate x
// shard x tensor x ulysses x ring whose product is the number of processes. The data-parallel
// degree is replicate x shard; shard > 1 shards parameters, gradients and optimizer state (FSDP),
// and with replicate > 1 as well that is HSDP.
#define VIDIT_PARALLEL_KEYS(KEY)                                                                       \
  KEY(int64_t, replicate, 1, positive, "data-parallel replicas (DDP / the replicate dim of HSDP)")     \
  KEY(int64_t, shard, 1, positive, "data-parallel ranks that shard parameters, gradients, optimizer state (FSDP)") \
  KEY(int64_t, tensor, 1, positive, "tensor parallel (heads and MLP split); divides model.heads and model.ffn_dim") \
  KEY(int64_t, ulysses, 1, positive, "Ulysses sequence parallel (all-to-all over heads); divides model.heads") \
  KEY(int64_t, ring, 1, positive, "ring-attention context parallel (K/V passed around a ring)")        \
  KEY(double, bucket_mb, 25.0, positive, "data parallel: gradients are all-reduced in buckets of about this many MiB") \
  KEY(bool, reshard_after_forward, true, any, "FSDP: free a block's gathered weights after its forward") \
  KEY(bool, prefetch, true, any, "FSDP: issue the next block's all-gather before the current block runs") \
  KEY(Precision, reduce_dtype, Precision::fp32, fp32_or_bf16, "FSDP: gradients reduce-scattered in \"fp32\" or \"bf16\"") \
  KEY(Precision, gather_dtype, Precision::fp32, fp32_or_bf16,                                          \
      "FSDP: weights all-gathered in \"fp32\" or \"bf16\" (half the bytes; what bf16 autocast multiplies by anyway)") \
  KEY(bool, fp8_all_gather, true, any,                                                                 \
      "FSDP with train.precision fp8 / fp8_rowwise: the blocks' FP8 projection weights are all-gathered in e4m3 " \
      "(1 byte a weight), quantised by their owners with scales agreed in one all-reduce per forward") \
  KEY(bool, apply_all, false, any,                                                                     \
      "apply tensor parallel and FSDP even at degree 1, so a one-process run (e.g. one GPU over NCCL) " \
      "runs their code and collectives; for checks")

// Fault injection, part of the product and off by default (src/resilience/fault_injection.h):
// what goes wrong, after which step, on which rank. For testing recovery with real jobs.
#define VIDIT_FAULT_KEYS(KEY)                                                                          \
  KEY(FaultKind, kind, FaultKind::none, any,                                                           \
      "\"none\"; after the step, on the rank: \"exit\", \"kill\" (SIGKILL), \"sigterm\" (a scheduler's stop), "  \
      "\"hang\" (stops making progress), \"slow\" (every step from then on takes faults.seconds longer), "  \
      "\"nan_grad\" (NaN in its gradients, in step faults.step itself), \"bitflip\" (one bit of one weight); in the "   \
      "step's checkpoint: \"corrupt_checkpoint\" (4 KiB of garbage) or \"truncate_checkpoint\" (half its size) " \
      "in the model part; while the rank writes it: \"disk_full\" (ENOSPC), \"io_error\" (EIO at fsync), "     \
      "\"slow_storage\" (faults.seconds per file), \"kill_in_save\" (SIGKILL mid-file); in the step: "          \
      "\"poison_sample\" (its first sample's latents x 1000: a sample with extreme values), \"glitch\" "    \
      "(its first sample's prediction x 100, once: a transient hardware error); when the cache is "            \
      "prepared: \"poison_cache\" (sample faults.sample is written with its latents x 1000 and a valid checksum); " \
      "while the rank loads the checkpoint of step faults.step (0: the first it reads) at a resume: "        \
      "\"load_io_error\" (EIO), \"load_permission\" (EACCES), \"load_no_memory\" (ENOMEM from mmap); "       \
      "\"crash_in_commit\" (rank 0 is killed right after the commit's first rename of the step's directory)") \
  KEY(int64_t, step, 0, non_negative, "the step after which the fault happens")                       \
  KEY(int64_t, rank, 0, non_negative,                                                                 \
      "the rank it happens on (corrupt/truncate_checkpoint, crash_in_commit: rank 0 does them)")           \
  KEY(std::string, sample, "", any, "poison_cache: the cache key of the sample to poison")             \
  KEY(double, seconds, 2.0, non_negative, "slow: seconds added to each step; slow_storage: to each file written") \
  KEY(int64_t, attempt, 0, non_negative,                                                               \
      "the attempt of the job it happens in (TORCHELASTIC_RESTART_COUNT / SLURM_RESTART_COUNT; 0: the first)")

#define VIDIT_CONFIG_FIELD(type, name, value, check, doc) type name = value;
struct ModelConfig { VIDIT_MODEL_KEYS(VIDIT_CONFIG_FIELD) };
struct DataConfig { VIDIT_DATA_KEYS(VIDIT_CONFIG_FIELD) };
struct BucketConfig { VIDIT_BUCKET_KEYS(VIDIT_CONFIG_FIELD) };
struct DiffusionConfig { VIDIT_DIFFUSION_KEYS(VIDIT_CONFIG_FIELD) };
struct TrainConfig { VIDIT_TRAIN_KEYS(VIDIT_CONFIG_FIELD) };
struct CheckpointConfig { VIDIT_CHECKPOINT_KEYS(VIDIT_CONFIG_FIELD) };
struct SampleConfig { VIDIT_SAMPLE_KEYS(VIDIT_CONFIG_FIELD) };
struct TextConfig { VIDIT_TEXT_KEYS(VIDIT_CONFIG_FIELD) };
struct LoraConfig { VIDIT_LORA_KEYS(VIDIT_CONFIG_FIELD) };
struct DemoConfig { VIDIT_DEMO_KEYS(VIDIT_CONFIG_FIELD) };
struct ParallelConfig { VIDIT_PARALLEL_KEYS(VIDIT_CONFIG_FIELD) };
struct FaultConfig { VIDIT_FAULT_KEYS(VIDIT_CONFIG_FIELD) };
#undef VIDIT_CONFIG_FIELD

struct Config {
  ModelConfig model;
  DataConfig data;
  BucketConfig buckets;
  DiffusionConfig diffusion;
  TrainConfig train;
  CheckpointConfig checkpoint;
  SampleConfig sample;
  TextConfig text;
  LoraConfig lora;
  DemoConfig demo;
  ParallelConfig parallel;
  FaultConfig faults;
  std::string source;  // file it came from (for messages)
};

// Loads `path` (may be empty: defaults only), applies `overrides` ("section.key=value"),
// validates. Throws vidit::Error naming the key and file on any problem.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});
// The resolved config as TOML (printed at start and stored in checkpoints); parses back to `c`.
std::string config_to_toml(const Config& c);
// Every key with its type, default and doc, as Markdown (`vidit keys`, docs/CONFIG.md).
std::string config_reference();
// Throws when shapes are impossible (dim % heads, latent % patch, ...).
void validate_config(const Config& c);

int64_t head_dim(const ModelConfig& m);
// Tokens of one sample: (T/pt)*(H/ph)*(W/pw).
int64_t tokens_per_sample(const Config& c);

}  // namespace vidit

// Typed configuration for every part of vidit. The defaults are the embedded demo (a tiny DiT
// on the demo codec's latents), so `vidit demo` needs no file.
//, read from TOML with `--set key=value`
// overrides. Unknown keys (with the closest valid key suggested), wrong types and impossible
// shapes are refused by load_config() before any work starts.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace vidit {

struct ModelConfig {
  int64_t dim = 128;            // hidden size of every block
  int64_t ffn_dim = 256;        // MLP hidden size
  int64_t heads = 4;            // attention heads; dim % heads == 0, head_dim even
  int64_t layers = 4;           // number of DiT blocks
  int64_t in_channels = 12;     // latent channels in (demo codec: 3*2*2)
  int64_t out_channels = 12;    // latent channels predicted
  std::array<int64_t, 3> patch{2, 2, 2};  // (t, h, w) patch of the Conv3d embedding
  int64_t text_dim = 32;        // width of the text embeddings fed in (umT5: 4096)
  int64_t text_len = 8;         // text tokens; shorter captions are zero-padded (Wan: 512)
  int64_t freq_dim = 256;       // sinusoidal timestep embedding width
  double eps = 1e-6;            // LayerNorm / RMSNorm epsilon
  double rope_theta = 100.0;    // RoPE base (Wan: 10000; the demo's 4x4x6 grid wants faster angles)
};

struct DataConfig {
  // "demo" (generated shape videos), "synthetic" (random latents) or "cache" (a latent cache
  // written by `vidit prepare`, read with bucketed token-budget batches).
  std::string source = "demo";
  // Latent size of one training sample (frames, height, width), after the VAE / demo codec.
  // With source = "cache" the buckets decide the shapes and these only size `vidit info`.
  int64_t latent_frames = 6;
  int64_t latent_height = 8;
  int64_t latent_width = 8;
  // --- vidit prepare: manifest -> decode -> bucket -> latents -> cache ---
  std::string manifest;              // .jsonl / .csv manifest, or a folder of videos + .txt captions
  std::string cache_dir;             // where the latent cache is written and read
  std::string codec = "demo";        // "demo" (lossless space-to-depth) or "wan_vae"
  std::string vae_weights;           // Wan 2.1 VAE safetensors (codec = "wan_vae")
  std::string text_encoder = "demo"; // "demo" (built-in caption embedder) or "precomputed" (manifest files)
  std::string decoder = "auto";      // "auto" (NVDEC when a GPU is there, else CPU), "cpu", "nvdec"
  double fps = 0;                    // resample clips to this frame rate; 0 keeps the source rate
  int64_t decode_threads = 0;        // FFmpeg decode threads per clip; 0 = auto
  bool square_pixels = true;         // stretch non-square-pixel (anamorphic) video to square pixels
  std::string encode_device = "auto";  // where the VAE encodes: "auto" (CUDA when present), "cpu", "cuda"
  int64_t shard_mb = 1024;           // cache shard size
  std::string cache_dtype = "bf16";  // storage of latent mean / std: "bf16" or "fp32"
  // --- loading the cache ---
  int64_t token_budget = 0;          // tokens per batch per rank; 0 = batch_size x tokens of data.latent_*
  int64_t loader_threads = 2;        // background threads assembling batches
  int64_t prefetch = 4;              // batches prepared ahead
};

// Bucket shapes (see src/prepare/buckets.h): resolution tiers x aspect ratios x frame counts, in
// pixels and video frames (before the VAE). The defaults are the demo's (16x16 and 16x20 pixels,
// 6 frames, demo codec); configs/wan2.1-*.toml show buckets for real data.
struct BucketConfig {
  std::vector<int64_t> resolutions{16, 18};    // tiers: sqrt(height * width) targets
  std::vector<double> aspect_ratios{1.0, 1.25};  // width / height
  std::vector<int64_t> frames{6};              // frame counts, each 1 mod frame_stride
  int64_t frame_stride = 1;                    // 4: 4k+1 frames (Wan VAE); 1: any count (demo codec)
  int64_t multiple = 4;                        // height and width are multiples of this
  double max_upscale = 1.0;                    // largest allowed scale-up factor (1: never upscale)
};

struct DiffusionConfig {
  std::string timestep_sampling = "logit_normal";  // "uniform" or "logit_normal"
  double logit_mean = 0.0;        // mean of the logit-normal sigma distribution
  double logit_std = 1.0;         // std of the logit-normal sigma distribution
  double shift = 3.0;             // sigma' = s*sigma / (1 + (s-1)*sigma)
  double text_drop_prob = 0.1;    // probability of the null text for classifier-free guidance
};

struct TrainConfig {
  int64_t steps = 12000;          // optimizer steps
  int64_t batch_size = 12;        // samples per micro-batch
  int64_t grad_accum = 1;         // micro-batches per optimizer step
  double lr = 2e-3;               // peak learning rate
  double min_lr_ratio = 0.1;      // cosine floor as a fraction of lr
  int64_t warmup_steps = 100;     // linear warm-up steps
  std::string schedule = "cosine";  // "cosine" or "constant" after warm-up
  double weight_decay = 0.01;     // AdamW decay (never on norms, biases, modulation)
  double beta1 = 0.9;
  double beta2 = 0.99;
  double adam_eps = 1e-8;
  double grad_clip = 1.0;         // global-norm clip; 0 disables
  double ema_decay = 0.999;       // EMA of the weights; 0 disables
  uint64_t seed = 0;              // seeds init, data order, noise and timesteps
  std::string precision = "fp32"; // "fp32" or "bf16" (autocast matmuls; fp32 norms/modulation/RoPE)
  std::string device = "auto";    // "auto" (CUDA when present), "cpu" or "cuda" (GPU = LOCAL_RANK)
  std::string out_dir = "runs/demo";  // checkpoints, metrics.jsonl, samples
  int64_t log_every = 50;         // steps between log lines
  int64_t ckpt_every = 0;         // steps between checkpoints; 0: only at the end
  int64_t keep_checkpoints = 2;   // newest checkpoints kept on disk
  int64_t threads = 0;            // intra-op threads; 0 = all cores
  double peak_tflops = 0;         // per device, for MFU; 0 = from the GPU's name (core/peak_flops.h)
  int64_t recompute_blocks = 0;   // activation checkpointing: recompute the first N blocks in
                                  // backward instead of keeping their activations; -1 = all
  int64_t trace_steps = 0;        // write a Chrome trace of this many steps (after the first) to
                                  // <out_dir>/trace/rank<R>.json; 0 = off
  std::string init_from;          // weights to start from: a .safetensors file or a folder of
                                  // shards (e.g. the official Wan 2.1 release); "" = random init
};

struct SampleConfig {
  int64_t steps = 30;             // Euler steps from sigma=1 to 0
  double shift = 3.0;             // sigma schedule shift at sampling
  double cfg_scale = 5.0;         // classifier-free guidance scale; 1 disables
  uint64_t seed = 1;
};

struct DemoConfig {
  int64_t videos = 192;           // training clips generated
  int64_t frame_size = 16;        // training frame size in pixels (square), after center crop
  int64_t frames = 6;             // training frames per clip
  int64_t codec_block = 2;        // space-to-depth block of the lossless demo codec
  int64_t text_dim = 32;          // width of the built-in caption embedder
  int64_t samples_per_prompt = 4; // generated videos per held-out prompt in the check
  int64_t eval_every = 0;         // also check held-out adherence every N training steps; 0: at the end only
  double colourless_captions = 0; // fraction of training clips captioned without their colour
};

// How the processes of a run are arranged (src/parallel/mesh.h): a mesh of degrees replicate x shard x
// tensor x ulysses x ring whose product is the number of processes. The data-parallel degree is
// replicate x shard; shard > 1 shards parameters, gradients and optimizer state (FSDP, parallel/fsdp.h),
// and with replicate > 1 as well that is HSDP.
struct ParallelConfig {
  int64_t replicate = 1;  // data-parallel replicas (DDP / the replicate dim of HSDP)
  int64_t shard = 1;      // data-parallel ranks that shard parameters, gradients, optimizer state (FSDP)
  int64_t tensor = 1;     // tensor parallel (heads and MLP split); divides model.heads and model.ffn_dim
  int64_t ulysses = 1;    // Ulysses sequence parallel (all-to-all over heads); divides model.heads
  int64_t ring = 1;       // ring-attention context parallel (K/V passed around a ring)
  double bucket_mb = 25;  // data parallel: gradients are all-reduced in buckets of about this many MiB
  bool reshard_after_forward = true;  // FSDP: free a block's gathered weights after its forward
  bool prefetch = true;   // FSDP: issue the next block's all-gather before the current block runs
  std::string reduce_dtype = "fp32";  // FSDP: gradients reduce-scattered in "fp32" or "bf16"
};

struct Config {
  ModelConfig model;
  DataConfig data;
  BucketConfig buckets;
  DiffusionConfig diffusion;
  TrainConfig train;
  SampleConfig sample;
  DemoConfig demo;
  ParallelConfig parallel;
  std::string source;  // file it came from (for messages)
};

// Loads `path` (may be empty: defaults only), applies `overrides` ("section.key=value"),
// validates. Throws vidit::Error naming the key and file on any problem.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});
// The resolved config as TOML (printed at start and stored in checkpoints).
std::string config_to_toml(const Config& c);
// Throws when shapes are impossible (dim % heads, latent % patch, ...).
void validate_config(const Config& c);

int64_t head_dim(const ModelConfig& m);
// Tokens of one sample: (T/pt)*(H/ph)*(W/pw).
int64_t tokens_per_sample(const Config& c);

}  // namespace vidit

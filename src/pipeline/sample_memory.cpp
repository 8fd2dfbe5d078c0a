// The analytical model of sample_memory.h: each phase's terms, counted from the code they name.
#include "pipeline/sample_memory.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "model/model_info.h"
#include "pipeline/sampling_ranks.h"
#include "vae/tiling.h"

namespace vidit {
namespace {

int64_t bytes_of(at::ScalarType t) { return int64_t(c10::elementSize(t)); }

// Terms of one phase, added by name into one of its three groups.
struct Ledger {
  PhaseMemory p;
  void weight(const std::string& n, int64_t b) { p.weights += b, p.terms.push_back({"weights: " + n, b}); }
  void load(const std::string& n, int64_t b) { p.loading += b, p.terms.push_back({"loading: " + n, b}); }
  void run(const std::string& n, int64_t b) { p.terms.push_back({"running: " + n, b}); }
};

// ---- text: umT5 ------------------------------------------------------------------------------

PhaseMemory text_phase(const SampleMemoryInputs& in) {
  const text::Umt5Config& c = in.text;
  const int64_t td = bytes_of(in.text_dtype), d = c.d_model, inner = c.inner_dim(), ffn_in = c.gated() ? 2 : 1;
  Ledger l;
  l.p.name = "text";
  l.weight("umT5 (" + std::string(c10::toString(in.text_dtype)) + ", norms fp32)", umt5_weight_bytes(c, in.text_dtype));
  // Umt5Encoder::load: the converted tensors stay in their map until the encoder is built; the
  // encoder concatenates q,k,v (and wi_0, wi_1) into new tensors; on the CPU in fp32 every
  // projection is also repacked for oneDNN (a copy of each).
  const bool packed = !in.cuda && in.text_dtype == at::kFloat && at::hasMKLDNN();
  int64_t copies = c.num_layers * (3 * inner * d + (c.gated() ? 2 * c.d_ff * d : 0));
  if (packed) copies = c.num_layers * (3 * inner * d + inner * d + ffn_in * c.d_ff * d + c.d_ff * d);
  l.load(packed ? "projections repacked while the loaded map is alive" : "q,k,v and FFN inputs concatenated "
         "while the loaded map is alive", copies * td);

  // Running: the prompt and the negative prompt in one batch, only their real tokens.
  const int64_t n1 = in.prompt_tokens > 0 ? in.prompt_tokens : in.model.text_len;
  const int64_t n2 = in.negative_tokens > 0 ? in.negative_tokens : n1;
  const int64_t R = n1 + n2, L = std::max(n1, n2);
  const int64_t nn = n1 == n2 ? n1 * n1 : n1 * n1 + n2 * n2;  // one position bias per distinct length
  const int64_t base_terms[] = {
      2 * in.model.text_len * d * 4,  // the result [2, text_len, d] fp32, zero-padded
      L * L * 8 + nn * 8,             // bucket indices [L, L] and per length, int64
      R * d * 4,                      // the residual stream x [R, d] fp32
      R * inner * td,                 // the attention output [R, inner]
  };
  l.run("result, bucket indices, residual, attention output",
        base_terms[0] + base_terms[1] + base_terms[2] + base_terms[3]);
  const int64_t block_common = R * d * td + 3 * R * inner * td + c.num_heads * nn * td;  // h, qkv, bias
  const int64_t ffn_point = R * ffn_in * c.d_ff * td + (c.gated() ? R * c.d_ff * td : 0) + R * d * td;
  const int64_t attn_point = R * inner * td;  // SDPA's output of a segment (at most all rows)
  l.run("block: normed input, qkv [R, 3 inner], position bias [H, n, n]", block_common);
  l.run(ffn_point >= attn_point ? "block: FFN input [R, 2 d_ff], gated product, output" : "block: attention output",
        std::max(ffn_point, attn_point));
  l.p.activations = base_terms[0] + base_terms[1] + base_terms[2] + base_terms[3] + block_common +
                    std::max(ffn_point, attn_point);
  l.p.peak_at = "a block's FFN";
  return l.p;
}

// ---- denoise: the DiT ------------------------------------------------------------------------

PhaseMemory denoise_phase(const SampleMemoryInputs& in) {
  const ModelConfig& m = in.model;
  const int64_t P = count_parameters(m);
  // Bytes of the weights as held: 2-D weights (the projections) in bf16 with sample.dtype bf16
  // (not under FSDP, whose shards stay fp32); the blocks' projections split over tensor parallel.
  const bool bf16 = in.bf16_projections && in.shard == 1;
  int64_t held = 0, root = 0, block = 0, largest_cast = 0;
  for (const auto& [name, shape] : parameter_shapes(m)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const bool projection = shape.size() == 2;
    const bool in_block = name.rfind("blocks.", 0) == 0;
    const int64_t split = projection && in_block ? in.tensor : 1;
    const int64_t bytes = n / split * (projection && bf16 ? 2 : 4);
    held += bytes;
    if (!in_block) root += bytes;
    else if (name.rfind("blocks.0.", 0) == 0) block += bytes;
    if (projection) largest_cast = std::max(largest_cast, n / split * 2);
  }
  Ledger l;
  l.p.name = "denoise";
  const std::string what = std::string(bf16 ? "DiT, projections bf16, the rest fp32" : "DiT, fp32") + " (" +
                           std::to_string(P) + " parameters";
  if (in.shard > 1) {
    l.weight(what + "), this rank's 1/" + std::to_string(in.shard) + " (FSDP)", (held + in.shard - 1) / in.shard);
    l.weight("FSDP: the root (embeddings, head) and two blocks gathered whole", root + 2 * block);
  } else {
    l.weight(what + (in.tensor > 1 ? ", the blocks' projections split over " + std::to_string(in.tensor) : "") + ")", held);
  }
  if (!in.cuda && in.transformer_file_bytes > 0) l.load("the weight file's tensors", P * in.transformer_file_bytes / in.shard);

  const int64_t B = in.guidance && !in.halves ? 2 : 1, D = m.dim, F = m.ffn_dim, Lt = m.text_len, ct = m.text_dim;
  const int64_t hd = D / m.heads;
  const int64_t T = (in.frames - 1) / 4 + 1, h = in.height / 8, w = in.width / 8;
  const int64_t Lall = (T / m.patch[0]) * (h / m.patch[1]) * (w / m.patch[2]);
  const int64_t Ltok = Lall / in.sp;  // this rank's tokens
  const int64_t latent = m.in_channels * T * h * w * 4;
  // Element sizes: e projections (bf16 under autocast), a attention output, s fp32 stream.
  const bool autocast = in.cuda || bf16;
  const int64_t e = autocast ? 2 : 4, a = autocast ? 2 : 4, s = 4;
  const int64_t tp = in.tensor;  // q, k, v, the attention output and the MLP's hidden units are split
  int64_t run = 0;
  auto add = [&](const std::string& n, int64_t b) { l.run(n, b), run += b; };
  if (autocast && !bf16) add("autocast's bf16 cast of one projection weight at a time", largest_cast);
  add("text input cat and its padded copy [B, text_len, text_dim] fp32", 2 * B * Lt * ct * 4);
  add("context [B, text_len, dim]", B * Lt * D * e);
  add("RoPE cos, sin [L, head_dim / 2] fp32", Ltok * hd * 4);
  add(std::string("sampler latents (noise, x, batch-") + std::to_string(B) + " in and out" +
      (in.unipc ? ", UniPC's history" : "") + (in.halves ? ", the pair's two velocities)" : ")"),
      latent * (2 + 2 * B + (in.unipc ? 3 : 0) + (in.cuda ? 1 : 0) + (in.halves ? 2 : 0)));
  // The block's busiest point: fc2 of the MLP (the cross-attention output projection and the
  // final gated add are counted too; the largest of the three is taken). q, k, v and the
  // attention output (e, 4, 4, a below) are 1/tensor wide.
  const int64_t BL = B * Ltok;
  const int64_t at_fc2 = BL * (D * (s + (4 + 4 + e + a) / tp + e + s + e + s + s + e) + 2 * F / tp * e);
  const int64_t at_cross = BL * D * (s + (4 + 4 + e + a) / tp + e + s + s + s + a + e) + B * Lt * D * (4 + e);
  const int64_t at_end = BL * D * (s + (4 + 4 + e + a) / tp + e + s + e + s + s + e + s);
  const int64_t busiest = std::max({at_fc2, at_cross, at_end});
  add(busiest == at_fc2 ? "block at the MLP's fc2: 11 [B, L, dim] and 2 [B, L, ffn] tensors"
                        : "block: 11-12 [B, L, dim] tensors", busiest);
  if (in.sp > 1)  // Ulysses' all-to-all inputs and outputs of q, k, v (ring: two key / value blocks in flight)
    add("sequence parallel: the exchanges' buffers, 4 [B, L/sp, dim]", 4 * BL * D * a / tp);
  l.p.activations = run;
  l.p.peak_at = "a block's MLP, " + std::to_string(Ltok) + " tokens x batch " + std::to_string(B);
  return l.p;
}

// ---- decode: the Wan VAE ---------------------------------------------------------------------

// What a convolution allocates beside its input and output. On CUDA nothing counted here
// (cuDNN workspaces are not counted). On the CPU ATen takes oneDNN or its own slow path by the
// rule of ConvParams::use_mkldnn (aten/src/ATen/native/Convolution.cpp) for fp32 inputs: oneDNN
// when not (1x1 kernel, one thread, batch < 16) and (batch > 1 or the product of the input's
// first four dims > 20480); a 3x3 kernel is never "> 3". oneDNN copies the input and the weight
// into its blocked layouts; the slow path builds an im2col / vol2col buffer of
// C_in * kernel volume * output positions (none for a 1x1x1 kernel).
int64_t conv_scratch(bool cuda, int64_t n, int64_t cin, int64_t cout, int64_t kt, int64_t k, int64_t t_in,
                     int64_t t_out, int64_t H, int64_t W, bool three_d) {
  if (cuda) return 0;
  const int64_t first_four = three_d ? n * cin * t_in * H : n * cin * H * W;
  const bool onednn = at::hasMKLDNN() && (n >= 16 || k != 1 || at::get_num_threads() > 1) && (n > 1 || first_four > 20480);
  if (onednn) return n * cin * t_in * H * W + cout * cin * kt * k * k;
  if (kt * k * k == 1) return 0;
  return n * cin * kt * k * k * t_out * H * W;
}

// The decoder on one chunk (one latent frame of a tile h x w, not the first): the causal cache
// it keeps, and the most any one layer holds, its input included. Element counts (fp32 later).
struct ChunkUse {
  int64_t cache = 0;  // every time-padded conv's last 2 input frames
  int64_t layer = 0;  // the busiest layer's input and what it allocates
  int64_t frames = 0; // video frames the chunk makes
};

ChunkUse decoder_chunk(const WanVAEConfig& c, int64_t h, int64_t w, bool cuda) {
  ChunkUse u;
  const int64_t stages = int64_t(c.dim_mult.size()), top = c.base_dim * c.dim_mult.back();
  int64_t f = 1, H = h, W = w;  // frames and frame size at the current layer
  auto keep = [&](int64_t ch) { u.cache += ch * 2 * H * W; };
  auto peak = [&](int64_t v) { u.layer = std::max(u.layer, v); };
  // A causal 3x3x3 conv of a chunk: the 2 cached frames prepended (a new tensor) and its scratch.
  auto causal = [&](int64_t cin, int64_t cout) {
    return cin * (f + 2) * H * W + cout * f * H * W + conv_scratch(cuda, 1, cin, cout, 3, 3, f + 2, f, H, W, true);
  };
  // A residual block: at each conv its input x, the shortcut's output, the norm and SiLU feeding
  // the conv (and, at the second, the first conv's output), the conv's sequence, output, scratch.
  auto residual = [&](int64_t cin, int64_t cout) {
    keep(cin), keep(cout);
    const int64_t x = cin * f * H * W, y = cout * f * H * W, sc = cin != cout ? y : 0;
    peak(x + sc + 2 * x + causal(cin, cout));
    peak(x + sc + 3 * y + causal(cout, cout));
  };
  keep(c.z_dim);  // decoder conv1
  peak(c.z_dim * f * H * W + causal(c.z_dim, top));
  residual(top, top);
  peak(12 * top * f * H * W);  // per-frame attention: x, norm, qkv, q/k/v copies, output, projection
  residual(top, top);
  int64_t dim = top;
  for (int64_t s = 0; s < stages; ++s) {
    const int64_t out = c.base_dim * c.dim_mult[stages - 1 - s];
    for (int64_t r = 0; r < c.num_res_blocks + 1; ++r) residual(dim, out), dim = out;
    if (s + 1 == stages) break;
    const bool in_time = c.temporal_downsample[stages - 2 - s];
    const int64_t x = out * f * H * W;
    if (in_time) {
      // time_conv (kernel 3x1x1) doubles the channels; the halves become frames (a reshaped
      // copy); per frame (a view for batch 1) nearest x2 makes 4x the pixels, then the conv to
      // out/2 channels.
      keep(out);
      peak(x + out * (f + 2) * H * W + 2 * x + conv_scratch(cuda, 1, out, 2 * out, 3, 1, f + 2, f, H, W, true));
      peak(x + 2 * x + 8 * x + 4 * x + conv_scratch(cuda, 2 * f, out, out / 2, 1, 3, 1, 1, 2 * H, 2 * W, false));
      f *= 2;
    } else {
      peak(x + 4 * x + 2 * x + conv_scratch(cuda, f, out, out / 2, 1, 3, 1, 1, 2 * H, 2 * W, false));
    }
    H *= 2, W *= 2;
    dim = out / 2;
  }
  keep(dim);  // head: norm, SiLU, the causal conv to 3 channels
  peak(3 * dim * f * H * W + causal(dim, 3));
  u.frames = f;
  return u;
}

PhaseMemory decode_phase(const SampleMemoryInputs& in) {
  const WanVAEConfig& c = in.vae;
  const int64_t P = count_vae_parameters(c);
  Ledger l;
  l.p.name = "decode";
  l.weight("Wan VAE, fp32, encoder and decoder (" + std::to_string(P) + " parameters)", P * 4);
  if (!in.cuda) l.load("the weight file's tensors", P * in.vae_file_bytes);

  const int64_t sf = c.spatial_factor(), T = (in.frames - 1) / c.temporal_factor() + 1;
  const int64_t h = in.height / sf, w = in.width / sf, F = in.frames, HW = in.height * in.width;
  const int64_t video = 3 * F * HW * 4;  // [1, 3, F, H, W] fp32
  const bool tiled = in.tiled && (in.height > in.tiling.tile || in.width > in.tiling.tile);
  const int64_t th = tiled ? std::min(h, in.tiling.tile / sf) : h, tw = tiled ? std::min(w, in.tiling.tile / sf) : w;
  const ChunkUse u = decoder_chunk(c, th, tw, in.cuda);
  const int64_t tile_video = 3 * F * th * tw * sf * sf * 4;
  const int64_t latents = c.z_dim * T * h * w * 4;
  int64_t loop = 2 * latents + (u.cache + u.layer) * 4;  // denormalised and conv2'd latents
  // The frames decoded so far of this tile (the chunk's own come on top at the cat).
  loop += tile_video;
  if (tiled) loop += video + HW * 4;  // the full-size accumulator and its weight sum
  // Tiles shared among the ranks: each first decodes its own, kept until they are blended.
  const int64_t tiles = tiled ? int64_t(tile_spans(h, in.tiling.tile / sf, in.tiling.stride / sf).size() *
                                        tile_spans(w, in.tiling.tile / sf, in.tiling.stride / sf).size()) : 1;
  const int64_t own_tiles = tiled && in.ranks > 1 ? (tiles + in.ranks - 1) / in.ranks : 0;
  loop += own_tiles * tile_video;
  // The end: the pipeline's uint8 conversion, video + four fp32 temporaries + two uint8 copies.
  const int64_t end = 5 * video + 2 * 3 * F * HW;
  l.run("latents: denormalised and conv2'd", 2 * latents);
  l.run("causal cache: 2 frames per time-padded conv", u.cache * 4);
  l.run("the busiest decoder layer of a chunk", u.layer * 4);
  l.run(tiled ? "frames decoded so far (a tile), the accumulator and its weights" : "frames decoded so far",
        tile_video + (tiled ? video + HW * 4 : 0));
  if (own_tiles > 0) l.run("this rank's " + std::to_string(own_tiles) + " of " + std::to_string(tiles) + " tiles, decoded first", own_tiles * tile_video);
  l.run("to uint8: 5 fp32 videos + 2 uint8", end);
  l.p.activations = std::max(loop, end);
  l.p.peak_at = end >= loop ? "the uint8 conversion" : "decoding a chunk";
  return l.p;
}

}  // namespace

int64_t count_vae_parameters(const WanVAEConfig& cfg) {
  WanVAE vae(cfg, at::TensorOptions().device(at::kMeta));
  int64_t n = 0;
  for (const auto& p : vae->parameters()) n += p.numel();
  return n;
}

int64_t umt5_weight_bytes(const text::Umt5Config& c, at::ScalarType dtype) {
  const int64_t td = bytes_of(dtype), d = c.d_model, inner = c.inner_dim();
  const int64_t per_layer = (4 * inner * d + (c.gated() ? 2 : 1) * c.d_ff * d + c.d_ff * d + c.num_buckets * c.num_heads) * td +
                            2 * d * 4;
  return c.vocab_size * d * td + c.num_layers * per_layer + d * 4;
}

SampleMemoryInputs sample_memory_inputs(const Config& cfg, const VideoRequest& request, at::Device device, int ranks) {
  SampleMemoryInputs in;
  in.model = cfg.model;
  in.text_dtype = cfg.text.dtype == Precision::fp32 ? at::kFloat : at::kBFloat16;
  in.frames = request.frames, in.width = request.width, in.height = request.height;
  in.cuda = device.is_cuda();
  in.guidance = cfg.sample.cfg_scale != 1.0;
  in.unipc = cfg.sample.solver == Solver::unipc;
  in.tiled = request.width > 512 || request.height > 512;
  in.bf16_projections = cfg.sample.dtype == Precision::bf16;
  Config at_size = cfg;
  const std::vector<int64_t> shape = latent_shape(request, cfg.model);
  at_size.data.latent_frames = shape[2], at_size.data.latent_height = shape[3], at_size.data.latent_width = shape[4];
  const SamplingLayout layout = sampling_layout(cfg, tokens_per_sample(at_size), ranks);
  in.ranks = ranks;
  in.halves = layout.halves;
  in.sp = layout.parallel.ulysses * layout.parallel.ring;
  in.shard = layout.parallel.shard;
  in.tensor = layout.parallel.tensor;
  return in;
}

SampleMemory predict_sample_memory(const SampleMemoryInputs& in) {
  VideoRequest r;
  r.frames = in.frames, r.width = in.width, r.height = in.height;
  check_video_request(r, in.model);
  SampleMemory out;
  out.phases = {text_phase(in), denoise_phase(in), decode_phase(in)};
  for (PhaseMemory& p : out.phases) {
    p.peak = p.weights + std::max(p.loading, p.activations);
    if (p.loading > p.activations) p.peak_at = "loading";
    if (p.peak > out.peak) out.peak = p.peak, out.peak_phase = p.name;
  }
  return out;
}

std::string format_sample_memory(const SampleMemoryInputs& in, const SampleMemory& m) {
  auto gib = [](int64_t b) { return double(b) / double(1ull << 30); };
  std::ostringstream os;
  char line[256];
  const bool bf16 = in.bf16_projections && in.shard == 1;
  std::snprintf(line, sizeof line, "sampling memory, %lldx%lldx%lld frames x width x height on %s (DiT weights %s%s)%s:\n",
                (long long)in.frames, (long long)in.width, (long long)in.height, in.cuda ? "CUDA" : "the CPU",
                bf16 ? "bf16 projections" : "fp32", in.cuda || bf16 ? ", bf16 autocast" : "",
                in.ranks > 1 ? ", per rank" : "");
  os << line;
  std::snprintf(line, sizeof line, "  %-8s %10s %10s %12s %10s  %s\n", "phase", "weights", "loading", "activations",
                "peak", "peak at");
  os << line;
  for (const PhaseMemory& p : m.phases) {
    std::snprintf(line, sizeof line, "  %-8s %7.2f GiB %6.2f GiB %8.2f GiB %6.2f GiB  %s\n", p.name.c_str(),
                  gib(p.weights), gib(p.loading), gib(p.activations), gib(p.peak), p.peak_at.c_str());
    os << line;
  }
  std::snprintf(line, sizeof line, "  the run needs %.2f GiB, set by %s (each phase frees its model before the next)\n",
                gib(m.peak), m.peak_phase.c_str());
  os << line;
  if (in.ranks > 1) {
    std::snprintf(line, sizeof line, "  %d ranks: tokens split over %lld, weights over shard %lld and tensor %lld; text and "
                  "an untiled decode run on rank 0 (its figures above)\n", in.ranks, (long long)in.sp,
                  (long long)in.shard, (long long)in.tensor);
    os << line;
  }
  os << (!in.guidance ? "  no guidance (sample.cfg_scale = 1): batch 1\n"
         : in.halves  ? "  guidance on two halves of the ranks: batch 1 on each\n"
                      : "  guidance: both branches in one batch-2 call, so the DiT's activations are twice one branch's\n");
  return os.str();
}

}  // namespace vidit

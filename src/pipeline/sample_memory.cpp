// The analytical model of sample_memory.h: each phase's terms, counted from the code they name.
#include "pipeline/sample_memory.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "diffusion/frame_condition.h"
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
  const int64_t T = (in.frames - 1) / 4 + 1, h = in.height / in.vae_stride, w = in.width / in.vae_stride;
  const int64_t Lall = (T / m.patch[0]) * (h / m.patch[1]) * (w / m.patch[2]);
  const int64_t Ltok = Lall / in.sp;  // this rank's tokens
  const int64_t latent = m.out_channels * T * h * w * 4, input = m.in_channels * T * h * w * 4;
  const bool conditioned = m.condition != FrameCondition::none;
  const int64_t n_img = m.image_dim > 0 ? std::max<int64_t>(in.condition_pictures, 1) * in.clip.tokens() : 0;
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
      (in.unipc ? ", UniPC's history" : "") + (in.halves ? ", the pair's two velocities" : "") +
      (conditioned ? ", the frame condition)" : ")"),
      latent * (2 + B + (in.unipc ? 3 : 0) + (in.cuda ? 1 : 0) + (in.halves ? 2 : 0)) + B * input +
          (conditioned ? input - latent : 0));
  if (n_img > 0)
    add("image features [B, " + std::to_string(n_img) + ", image_dim] fp32 and their projection [B, n, dim]",
        B * n_img * (m.image_dim * 4 + D * e));
  // The block's busiest point: fc2 of the MLP (the cross-attention output projection and the
  // final gated add are counted too; the largest of the three is taken). q, k, v and the
  // attention output (e, 4, 4, a below) are 1/tensor wide.
  const int64_t BL = B * Ltok;
  const int64_t at_fc2 = BL * (D * (s + (4 + 4 + e + a) / tp + e + s + e + s + s + e) + 2 * F / tp * e);
  // With image tokens the image branch's attention output sits beside the text branch's.
  const int64_t at_cross = BL * D * (s + (4 + 4 + e + a) / tp + e + s + s + s + a + e + (n_img > 0 ? a : 0)) +
                           B * (Lt + n_img) * D * (4 + e);
  const int64_t at_end = BL * D * (s + (4 + 4 + e + a) / tp + e + s + e + s + s + e + s);
  const int64_t busiest = std::max({at_fc2, at_cross, at_end});
  add(busiest == at_fc2 ? "block at the MLP's fc2: 11 [B, L, dim] and 2 [B, L, ffn] tensors"
                        : busiest == at_cross ? "block at cross-attention: 12-13 [B, L, dim] tensors"
                                              : "block: 12 [B, L, dim] tensors", busiest);
  if (fuses_first_frame(m))  // Wan 2.2 TI2V's timestep per token (model/dit.h)
    add("a timestep per token: e [B, L, dim], e0 and one block's modulation [B, L, 6, dim] fp32", BL * D * 4 * 13);
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

// Walks a VAE coder's layers on one chunk: f frames of H x W at the current layer, the cache
// and busiest layer counted into `use` as each layer is met.
struct ChunkWalk {
  ChunkUse use;
  bool cuda;
  int64_t f, H, W;
  void keep(int64_t ch) { use.cache += ch * 2 * H * W; }
  void peak(int64_t v) { use.layer = std::max(use.layer, v); }
  // A causal 3x3x3 conv of a chunk: the 2 cached frames prepended (a new tensor) and its scratch.
  int64_t causal(int64_t cin, int64_t cout) const {
    return cin * (f + 2) * H * W + cout * f * H * W + conv_scratch(cuda, 1, cin, cout, 3, 3, f + 2, f, H, W, true);
  }
  // A residual block: at each conv its input x, the shortcut's output, the norm and SiLU feeding
  // the conv (and, at the second, the first conv's output), the conv's sequence, output, scratch.
  void residual(int64_t cin, int64_t cout) {
    keep(cin), keep(cout);
    const int64_t x = cin * f * H * W, y = cout * f * H * W, sc = cin != cout ? y : 0;
    peak(x + sc + 2 * x + causal(cin, cout));
    peak(x + sc + 3 * y + causal(cout, cout));
  }
};

ChunkUse decoder_chunk(const WanVAEConfig& c, int64_t h, int64_t w, bool cuda) {
  const int64_t stages = int64_t(c.dim_mult.size()), top = c.base_dim * c.dim_mult.back();
  ChunkWalk k{{}, cuda, 1, h, w};  // one latent frame
  int64_t &f = k.f, &H = k.H, &W = k.W;
  ChunkUse& u = k.use;
  auto keep = [&](int64_t ch) { k.keep(ch); };
  auto peak = [&](int64_t v) { k.peak(v); };
  auto causal = [&](int64_t cin, int64_t cout) { return k.causal(cin, cout); };
  auto residual = [&](int64_t cin, int64_t cout) { k.residual(cin, cout); };
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

// ---- image: the condition video through the VAE encoder, the pictures through CLIP ------------

// The encoder on a later chunk (4 frames of a tile h x w pixels), counted as decoder_chunk counts.
ChunkUse encoder_chunk(const WanVAEConfig& c, int64_t h, int64_t w, bool cuda) {
  const int64_t stages = int64_t(c.dim_mult.size()), top = c.base_dim * c.dim_mult.back();
  ChunkWalk k{{}, cuda, c.temporal_factor(), h, w};
  int64_t &f = k.f, &H = k.H, &W = k.W;
  ChunkUse& u = k.use;
  u.frames = f;
  auto keep = [&](int64_t ch) { k.keep(ch); };
  auto peak = [&](int64_t v) { k.peak(v); };
  auto causal = [&](int64_t cin, int64_t cout) { return k.causal(cin, cout); };
  auto residual = [&](int64_t cin, int64_t cout) { k.residual(cin, cout); };
  keep(3);  // conv1
  peak(3 * f * H * W + causal(3, c.base_dim));
  int64_t dim = c.base_dim;
  for (int64_t s = 0; s < stages; ++s) {
    const int64_t out = c.base_dim * c.dim_mult[s];
    for (int64_t r = 0; r < c.num_res_blocks; ++r) residual(dim, out), dim = out;
    if (s + 1 == stages) break;
    // Per frame: the frames' copy, padded right and bottom, the stride-2 conv, its output back
    // in [B, C, T, ...] order (a copy at the next layer).
    const int64_t x = out * f * H * W, half = out * f * (H / 2) * (W / 2);
    peak(x + x + out * f * (H + 1) * (W + 1) + 2 * half +
         conv_scratch(cuda, f, out, out, 1, 3, 1, 1, H / 2, W / 2, false));
    H /= 2, W /= 2;
    if (c.temporal_downsample[s]) {  // the last frame kept, prepended, a stride-2 time conv
      u.cache += out * H * W;
      peak(out * f * H * W * 2 + out * (f + 1) * H * W + out * (f / 2) * H * W +
           conv_scratch(cuda, 1, out, out, 3, 1, f + 1, f / 2, H, W, true));
      f /= 2;
    }
  }
  residual(top, top);
  peak(12 * top * f * H * W);  // per-frame attention
  residual(top, top);
  keep(top);  // head: norm, SiLU, the causal conv to the moments
  peak(3 * top * f * H * W + causal(top, 2 * c.z_dim));
  return u;
}

PhaseMemory image_phase(const SampleMemoryInputs& in) {
  const WanVAEConfig& c = in.vae;
  const ModelConfig& m = in.model;
  const int64_t sf = c.spatial_factor(), T = (in.frames - 1) / c.temporal_factor() + 1;
  const int64_t h = in.height / sf, w = in.width / sf, F = in.frames, HW = in.height * in.width;
  const int64_t pictures = std::max<int64_t>(in.condition_pictures, 1);
  // Stage 1: the VAE on the condition video.
  const int64_t P = count_vae_parameters(c);
  const int64_t vae_weights = P * 4, vae_loading = in.cuda ? 0 : P * in.vae_file_bytes;
  const int64_t video = 3 * F * HW * 4;
  const bool tiled = in.tiled && (in.height > in.tiling.tile || in.width > in.tiling.tile);
  const int64_t th = tiled ? std::min(in.height, in.tiling.tile) : in.height;
  const int64_t tw = tiled ? std::min(in.width, in.tiling.tile) : in.width;
  const ChunkUse u = encoder_chunk(c, th, tw, in.cuda);
  const int64_t moments = 2 * c.z_dim * T * h * w * 4, condition = (m.in_channels - m.out_channels) * T * h * w * 4;
  // The chunks' moments, their cat and conv1's output (per tile: the tile's video copy and the
  // blended moments and weights), the latents and, at the end, mask + latents and their cat.
  const int64_t tile_part = tiled ? 3 * F * th * tw * 4 + moments + T * h * w * 4 : 0;
  const int64_t vae_run = video + pictures * 3 * HW * 4 + (u.cache + u.layer) * 4 + 2 * moments + tile_part;
  // Stage 2: CLIP, the condition latent kept.
  const vision::ClipVisionConfig& k = in.clip;
  const int64_t clip_weights = m.image_dim > 0 ? k.parameters() * 4 : 0;
  const int64_t nt = pictures * k.tokens(), d = k.hidden_size;
  const int64_t clip_run = m.image_dim > 0 ? pictures * 3 * k.image_size * k.image_size * 4 +  // pixel values
                                                 nt * (2 * d + 3 * d + d + 2 * k.intermediate_size) * 4  // x, y, qkv, attention, fc1 and its activation
                                           : 0;
  const int64_t vae_peak = vae_weights + std::max(vae_loading, vae_run);
  const int64_t clip_peak = clip_weights + clip_run + condition;
  Ledger l;
  l.p.name = "image";
  l.run("VAE: the condition video [3, F, H, W] fp32 and the resized pictures", video + pictures * 3 * HW * 4);
  l.run("VAE: causal cache: 2 frames per time-padded conv", u.cache * 4);
  l.run("VAE: the busiest encoder layer of a chunk", u.layer * 4);
  l.run(tiled ? "VAE: moments and latents, a tile's video and the blend" : "VAE: moments and latents",
        2 * moments + tile_part);
  if (m.image_dim > 0) {
    l.run("CLIP: " + std::to_string(pictures) + " picture(s), one layer's tensors [" + std::to_string(nt) +
          " tokens]", clip_run);
    l.run("CLIP: the condition latent kept from the VAE", condition);
  }
  if (vae_peak >= clip_peak) {
    l.weight("Wan VAE, fp32 (" + std::to_string(P) + " parameters)", vae_weights);
    if (vae_loading > 0) l.load("the VAE file's tensors", vae_loading);
    l.p.activations = vae_run;
    l.p.peak_at = "encoding the condition video";
  } else {
    l.weight("CLIP image encoder, fp32 (" + std::to_string(k.parameters()) + " parameters)", clip_weights);
    l.p.activations = clip_run + condition;
    l.p.peak_at = "CLIP";
  }
  return l.p;
}

}  // namespace

const PhaseMemory& SampleMemory::phase(const std::string& name) const {
  for (const PhaseMemory& p : phases)
    if (p.name == name) return p;
  fail("sampling memory: no phase '", name, "'");
}

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

SampleMemoryInputs sample_memory_inputs(const Config& cfg, const VideoRequest& request, at::Device device, int ranks,
                                        int64_t vae_stride) {
  SampleMemoryInputs in;
  in.vae_stride = vae_stride;
  in.model = cfg.model;
  in.text_dtype = cfg.text.dtype == Precision::fp32 ? at::kFloat : at::kBFloat16;
  in.frames = request.frames, in.width = request.width, in.height = request.height;
  in.cuda = device.is_cuda();
  in.guidance = cfg.sample.cfg_scale != 1.0;
  in.unipc = cfg.sample.solver == Solver::unipc;
  in.tiled = request.width > 512 || request.height > 512;
  in.bf16_projections = cfg.sample.dtype == Precision::bf16;
  in.condition_pictures = cfg.model.condition == FrameCondition::first_last_frame ? 2
                          : cfg.model.condition == FrameCondition::first_frame    ? 1
                                                                                  : 0;
  Config at_size = cfg;
  const std::vector<int64_t> shape = latent_shape(request, cfg.model, vae_stride);
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
  check_video_request(r, in.model, in.vae_stride);
  SampleMemory out;
  out.phases = {text_phase(in)};
  if (in.model.condition != FrameCondition::none) out.phases.push_back(image_phase(in));
  out.phases.push_back(denoise_phase(in));
  out.phases.push_back(decode_phase(in));
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
  if (in.model.boundary > 0)
    os << "  two experts (model.boundary " << in.model.boundary << "): one resident at a time, the low-noise expert "
          "built when the high-noise one is freed at the boundary; the denoise weights above are one expert's\n";
  os << (!in.guidance ? "  no guidance (sample.cfg_scale = 1): batch 1\n"
         : in.halves  ? "  guidance on two halves of the ranks: batch 1 on each\n"
                      : "  guidance: both branches in one batch-2 call, so the DiT's activations are twice one branch's\n");
  return os.str();
}

}  // namespace vidit

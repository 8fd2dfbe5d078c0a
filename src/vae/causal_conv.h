// Causal 3D convolution, the time-aware layer of the Wan 2.1 video VAE, and the cache that lets a
// clip run through the VAE in temporal chunks.
//
// A causal convolution looks only at the current and earlier frames: time is padded with
// `time_pad` zero frames in front and none behind; height and width are padded symmetrically
// (kernel/2 on each side). So output frame t depends on input frames <= t only.
//
// Chunked runs: a long clip goes through the network a few frames at a time (the official code
// encodes frame 0 alone, then chunks of 4; it decodes one latent frame at a time). Every layer that
// looks back in time keeps, in a CausalCache, the last frames of the previous chunk it saw; the
// next chunk is prepended with them instead of zero padding. A chunked run therefore computes
// exactly what one pass over the whole clip computes, with activations of a few frames only.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <unordered_map>

namespace vidit {

// State carried between the temporal chunks of one clip (one encode or one decode). Make a fresh
// one per clip (and per spatial tile), pass it to every chunk in time order, then drop it.
// Holds tensors on the activations' device. Not thread-safe.
struct CausalCache {
  // The last input frames of the previous chunk, per layer (keyed by the layer's address).
  std::unordered_map<const void*, at::Tensor> frames;
  // True while the first chunk of the clip runs; the caller sets it false after that chunk. Layers
  // that treat frame 0 specially (temporal resampling) read it.
  bool first_chunk = true;
};

// Plain 2D convolution with PyTorch's parameter names (`weight` [out, in, k, k], `bias` [out]),
// applied to [N, C, H, W]. Our own so that the VAE can be built on any device, meta included.
struct VaeConv2dImpl : torch::nn::Module {
  VaeConv2dImpl(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t pad,
                const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;
  int64_t stride, pad;
};
TORCH_MODULE(VaeConv2d);

struct CausalConv3dImpl : torch::nn::Module {
  // Kernel [kt, ks, ks], temporal stride `stride_t` (spatial stride 1), `time_pad` zero frames in
  // front (the official layer's 2 * padding[0]), ks/2 spatial padding. Parameters `weight`
  // [out, in, kt, ks, ks] and `bias` [out], initialised like torch.nn.Conv3d.
  CausalConv3dImpl(int64_t in, int64_t out, int64_t kt, int64_t ks, int64_t time_pad,
                   int64_t stride_t, const at::TensorOptions& options);
  // x [B, in, T, H, W] -> [B, out, T', H, W].
  // cache == nullptr: x is the whole clip (zero padding in front).
  // cache given: x is the next chunk of the clip; the frames this layer kept from the previous
  // chunk replace (part of) the zero padding, and the last `time_pad` frames seen are kept for the
  // next chunk. A layer without time padding neither reads nor writes the cache.
  at::Tensor forward(const at::Tensor& x, CausalCache* cache = nullptr);

  at::Tensor weight, bias;
  int64_t time_pad, stride_t;
};
TORCH_MODULE(CausalConv3d);

}  // namespace vidit

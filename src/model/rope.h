// 3D rotary position embedding (RoPE) for video tokens, Wan 2.1 convention.
// A head of size d holds c = d/2 complex pairs, split over the axes as
//   t : h : w = c - 2*floor(c/3) : floor(c/3) : floor(c/3).
// Axis a with n pairs rotates pair j of a token at position p by p * theta^(-j/n).
// Pairs are adjacent channels (2j, 2j+1). Computed in fp32.
#pragma once
#include <ATen/ATen.h>

#include <array>

namespace vidit {

// Angles' cos and sin for a (frames, height, width) token grid in (t, h, w) order, with an
// optional offset added to every position. Returns {cos, sin}, each [L, head_dim/2] fp32.
std::array<at::Tensor, 2> rope_tables(int64_t frames, int64_t height, int64_t width,
                                      int64_t head_dim, double theta, const at::Device& device,
                                      std::array<int64_t, 3> offset = {0, 0, 0});

// Rotates x [B, L, heads, head_dim] (any float dtype; computed in fp32, returned in fp32).
at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace vidit

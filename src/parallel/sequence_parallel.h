// Sequence (context) parallelism: the tokens of every sample are split over the mesh's "sp"
// group (ulysses x ring), so a video whose activations fit no single device trains on several.
//
// apply_sequence_parallel(pm) transforms the model (model/dit.h TokenSplit and each
// block's attention function); the model's code is unchanged:
//  - After the patch embedding each member keeps one contiguous chunk of the token axis, and the
//    same chunk of the RoPE tables, so positions stay global. sp rank i (ring coordinate x
//    ulysses degree + ulysses coordinate) holds chunk i.
//  - Self-attention is Ulysses over the "ulysses" group (an all-to-all turns the token split into
//    a head split, every token attends for 1/u of the heads, a second all-to-all turns it back),
//    ring attention over the "ring" group (ring_attention.h), or both: Ulysses inside, the ring
//    outside over the Ulysses-gathered blocks.
//  - Cross-attention, norms, modulation, MLP and the head act per token and need nothing.
//  - The head's output is all-gathered, so every member holds the whole prediction and computes
//    the same loss as one process. The gather's backward keeps the member's own chunk, so each
//    member's parameter gradients hold its tokens' share; the trainer's gradient reduction sums
//    the shares over the sp group (data_parallel.h).
//
// Communication per block, per member, for Lc = L / sp local tokens of width dim: Ulysses moves
// 4 all-to-alls of Lc x dim (q, k, v in; the output back) forward and 4 backward, each sending
// (u-1)/u of its data; ring sends (r-1) key / value blocks of 2 x Lc' x dim forward and, in
// backward, (r-1) key / value blocks plus r gradient blocks.
#pragma once
#include <ATen/ATen.h>

#include <memory>

#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/parallel_model.h"
#include "model/dit.h"

namespace vidit {

// Differentiable exchanges over `comm` (n members).
// [B, Lc, H, D] token chunk, all heads -> [B, n*Lc, H/n, D] all tokens of the group, 1/n of the heads.
at::Tensor tokens_to_heads(const at::Tensor& x, const std::shared_ptr<Comm>& comm);
// The inverse: [B, n*Lc, H/n, D] -> [B, Lc, H, D].
at::Tensor heads_to_tokens(const at::Tensor& x, const std::shared_ptr<Comm>& comm);
// [B, Lc, C] -> [B, n*Lc, C] in member order; backward keeps this member's chunk of the gradient
// (every member computes the same function of the gathered tensor).
at::Tensor gather_tokens(const at::Tensor& x, const std::shared_ptr<Comm>& comm);

// Ulysses self-attention over `ulysses`; `inner` attends the head-split tensors (plain attention
// or ring attention over the ring group).
AttentionFn ulysses_attention(std::shared_ptr<Comm> ulysses, AttentionFn inner);

// Splits the model's tokens over the mesh's sp group (no-op when its degree is 1). Parameters
// stay whole: their layouts are unchanged, and the gradient shares are summed by the gradient
// reduction (data_parallel.h, fsdp.h).
void apply_sequence_parallel(ParallelModel& pm);

}  // namespace vidit

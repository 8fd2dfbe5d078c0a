// Activation checkpointing of a DiT block: the forward keeps only the block's inputs, and the
// backward runs the block's forward again (with gradients on) before going through it. A block
// then holds [B, L, dim] between forward and backward instead of everything its attention and
// MLP save (about (18 dim + 2 ffn_dim) values per token), for one more forward of the block.
//
// The recomputation is exact: same inputs, same weights, same autocast state (captured at the
// forward), and no randomness in the block. Gradients of the weights are accumulated into their
// .grad as usual (so FSDP's and data parallel's gradient hooks fire as without it), and those
// of the inputs flow on to the rest of the graph. Collectives inside the block (tensor parallel,
// Ulysses, ring) run again during the recomputation, in the same order on every rank.
// DiT::forward applies it to its first `recompute_blocks` blocks and the selective form below to
// the next `selective_blocks` (from train.recompute_blocks / train.recompute_policy, or chosen
// per block from train.memory_budget_gb: parallel/plan.h recompute_counts).
//
// train.recompute_policy = "selective" keeps more and reruns less: the block is taken in three
// parts, the first (LayerNorm + modulate, the q/k/v projections, QK norm, RoPE) and the last
// (the output projection, the gated residual, cross-attention and the MLP) recomputed, and the
// self-attention between them run once, keeping what its backward needs (q, k, v, its output):
// about 5 [B, L, dim] per block instead of 1, and the backward does not run attention's forward
// (at long sequences the largest part of a block's FLOPs) or its collectives (Ulysses'
// all-to-alls, the ring's passes) again.
#pragma once
#include <ATen/ATen.h>

namespace vidit {

struct DiTBlockImpl;

// block.forward(x, e0, context, cos, sin), keeping only the inputs for backward.
at::Tensor recomputed_block(DiTBlockImpl& block, const at::Tensor& x, const at::Tensor& e0,
                            const at::Tensor& context, const at::Tensor& cos, const at::Tensor& sin);
// The same, keeping also the self-attention's inputs and output.
at::Tensor selectively_recomputed_block(DiTBlockImpl& block, const at::Tensor& x, const at::Tensor& e0,
                                        const at::Tensor& context, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace vidit

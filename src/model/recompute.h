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
// DiT::forward applies it to its first `recompute_blocks` blocks (train.recompute_blocks).
#pragma once
#include <ATen/ATen.h>

namespace vidit {

struct DiTBlockImpl;

// block.forward(x, e0, context, cos, sin), keeping only the inputs for backward.
at::Tensor recomputed_block(DiTBlockImpl& block, const at::Tensor& x, const at::Tensor& e0,
                            const at::Tensor& context, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace vidit

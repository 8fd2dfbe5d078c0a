// Ring attention (context parallel): each member of the "ring" group holds one contiguous block
// of the sequence's queries, keys and values. Keys and values travel around the ring, one hop
// per step, while each member attends its queries to the block it holds; the partial results
// are merged exactly with their log-sum-exp (online softmax), so the output equals attention
// over the whole sequence. Communication overlaps compute: the next block's send / receive is
// posted before the current block's attention.
//
// Backward passes K and V around the ring again, with the gradients dK and dV travelling beside
// them and collecting every member's contribution; a last hop brings each block's dK, dV home.
// Each block's gradients come from the attention backward given the merged output and
// log-sum-exp, which makes them exact.
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <memory>

#include "parallel/comm.h"

namespace vidit {

// q, k, v [B, Lc, heads, head_dim]: this member's block. Returns [B, Lc, heads * head_dim]
// (model/layers.h AttentionFn contract), differentiable.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::shared_ptr<Comm>& ring);

// The building blocks, on [B, heads, L, head_dim] tensors: attention of a query block on one
// key / value block, returning {out (q's dtype), lse [B, heads, Lq] (fp32, fp64 for fp64)}; and
// its backward given the final (merged) out and lse, returning {dq, dk, dv}. The CPU uses
// ATen's flash kernels; other devices an exact composition.
std::array<at::Tensor, 2> attention_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
std::array<at::Tensor, 3> attention_block_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                                   const at::Tensor& k, const at::Tensor& v,
                                                   const at::Tensor& out, const at::Tensor& lse);

}  // namespace vidit

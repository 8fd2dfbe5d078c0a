#include "model/recompute.h"

#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include "core/precision.h"
#include "model/dit.h"

namespace vidit {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The forward's autocast state and the block, for the backward's rerun.
void remember(AutogradContext* ctx, const at::Tensor& x, DiTBlockImpl& block) {
  const at::DeviceType device = x.device().type();
  ctx->saved_data["block"] = int64_t(reinterpret_cast<intptr_t>(&block));
  ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(device);
  ctx->saved_data["autocast_dtype"] = int64_t(at::autocast::get_autocast_dtype(device));
}

DiTBlockImpl& block_of(AutogradContext* ctx) {
  return *reinterpret_cast<DiTBlockImpl*>(ctx->saved_data["block"].toInt());
}

// Runs `part` again on fresh leaves made of the saved inputs (the first `grad_inputs` of them
// require a gradient where the forward's inputs needed one), with gradients on and the autocast
// state of the forward, and takes `grads` back through its outputs: the weights' gradients
// accumulate into their .grad as usual (their hooks fire), the inputs' are returned (undefined
// for the rest).
template <class Part>
variable_list rerun(AutogradContext* ctx, size_t grad_inputs, const variable_list& grads, Part part) {
  const variable_list saved = ctx->get_saved_variables();
  variable_list in;
  for (size_t i = 0; i < saved.size(); ++i) {
    at::Tensor leaf = saved[i].detach();
    if (i < grad_inputs && ctx->needs_input_grad(i)) leaf.requires_grad_(true);
    in.push_back(leaf);
  }
  variable_list out;
  {
    at::AutoGradMode grad_on(true);
    AutocastGuard autocast(in[0].device().type(), ctx->saved_data["autocast"].toBool(),
                           at::ScalarType(ctx->saved_data["autocast_dtype"].toInt()));
    out = part(block_of(ctx), in);
  }
  variable_list roots, root_grads;
  for (size_t i = 0; i < out.size(); ++i)
    if (grads[i].defined() && out[i].requires_grad()) roots.push_back(out[i]), root_grads.push_back(grads[i]);
  if (!roots.empty()) torch::autograd::backward(roots, root_grads);
  variable_list result;
  for (const at::Tensor& leaf : in) result.push_back(leaf.requires_grad() ? leaf.grad() : at::Tensor());
  result.push_back(at::Tensor());  // the block pointer
  return result;
}

// The whole block; keeps x, e0, context, cos, sin.
class RecomputedBlock : public torch::autograd::Function<RecomputedBlock> {
 public:
  // Runs without building a graph (custom functions' forward runs with grad mode off).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& e0, const at::Tensor& context,
                            const at::Tensor& cos, const at::Tensor& sin, int64_t block) {
    DiTBlockImpl& b = *reinterpret_cast<DiTBlockImpl*>(block);
    remember(ctx, x, b);
    ctx->save_for_backward({x, e0, context, cos, sin});
    return b.forward(x, e0, context, cos, sin);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return rerun(ctx, 3, grad, [](DiTBlockImpl& b, const variable_list& in) {
      return variable_list{b.forward(in[0], in[1], in[2], in[3], in[4])};
    });
  }
};

// The selective policy's first part: x, e -> q, k, v; keeps x, e, cos, sin.
class RecomputedAttentionInputs : public torch::autograd::Function<RecomputedAttentionInputs> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& e, const at::Tensor& cos,
                               const at::Tensor& sin, int64_t block) {
    DiTBlockImpl& b = *reinterpret_cast<DiTBlockImpl*>(block);
    remember(ctx, x, b);
    ctx->save_for_backward({x, e, cos, sin});
    return b.attention_inputs(x, e, cos, sin);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return rerun(ctx, 2, grad, [](DiTBlockImpl& b, const variable_list& in) {
      return b.attention_inputs(in[0], in[1], in[2], in[3]);
    });
  }
};

// Its last part: x, e, the attention's output, context -> the block's output; keeps them.
class RecomputedAfterAttention : public torch::autograd::Function<RecomputedAfterAttention> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& e, const at::Tensor& a,
                            const at::Tensor& context, int64_t block) {
    DiTBlockImpl& b = *reinterpret_cast<DiTBlockImpl*>(block);
    remember(ctx, x, b);
    ctx->save_for_backward({x, e, a, context});
    return b.after_attention(x, e, a, context);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return rerun(ctx, 4, grad, [](DiTBlockImpl& b, const variable_list& in) {
      return variable_list{b.after_attention(in[0], in[1], in[2], in[3])};
    });
  }
};

int64_t pointer(DiTBlockImpl& block) { return int64_t(reinterpret_cast<intptr_t>(&block)); }

}  // namespace

at::Tensor recomputed_block(DiTBlockImpl& block, const at::Tensor& x, const at::Tensor& e0, const at::Tensor& context,
                            const at::Tensor& cos, const at::Tensor& sin) {
  return RecomputedBlock::apply(x, e0, context, cos, sin, pointer(block));
}

at::Tensor selectively_recomputed_block(DiTBlockImpl& block, const at::Tensor& x, const at::Tensor& e0,
                                        const at::Tensor& context, const at::Tensor& cos, const at::Tensor& sin) {
  // The modulation outside both parts: its weight then gets its gradient once, as FSDP's
  // per-parameter gradient hooks expect.
  const at::Tensor e = block.modulated(e0);
  const variable_list h = RecomputedAttentionInputs::apply(x, e, cos, sin, pointer(block));
  const at::Tensor a = block.self_attn->attend(h[0], h[1], h[2]);  // kept: SDPA saves q, k, v and its output
  return RecomputedAfterAttention::apply(x, e, a, context, pointer(block));
}

}  // namespace vidit

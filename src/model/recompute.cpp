#include "model/recompute.h"

#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include "core/precision.h"
#include "model/dit.h"

namespace vidit {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class RecomputedBlock : public torch::autograd::Function<RecomputedBlock> {
 public:
  // Runs without building a graph (custom functions' forward runs with grad mode off).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& e0, const at::Tensor& context,
                            const at::Tensor& cos, const at::Tensor& sin, int64_t block) {
    const at::DeviceType device = x.device().type();
    ctx->saved_data["block"] = block;
    ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(device);
    ctx->saved_data["autocast_dtype"] = int64_t(at::autocast::get_autocast_dtype(device));
    ctx->save_for_backward({x, e0, context, cos, sin});
    return reinterpret_cast<DiTBlockImpl*>(block)->forward(x, e0, context, cos, sin);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    DiTBlockImpl& block = *reinterpret_cast<DiTBlockImpl*>(ctx->saved_data["block"].toInt());
    variable_list saved = ctx->get_saved_variables();
    // Fresh leaves: the recomputed graph ends at them, and their .grad is what flows on.
    variable_list in;
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor leaf = saved[i].detach();
      if (i < 3 && ctx->needs_input_grad(i)) leaf.requires_grad_(true);
      in.push_back(leaf);
    }
    at::Tensor out;
    {
      at::AutoGradMode grad_on(true);
      AutocastGuard autocast(in[0].device().type(), ctx->saved_data["autocast"].toBool(),
                             at::ScalarType(ctx->saved_data["autocast_dtype"].toInt()));
      out = block.forward(in[0], in[1], in[2], in[3], in[4]);
    }
    // Accumulates into the block's weights (their gradient hooks fire) and the leaves above.
    torch::autograd::backward({out}, {grad[0]});
    return {in[0].grad(), in[1].grad(), in[2].grad(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor recomputed_block(DiTBlockImpl& block, const at::Tensor& x, const at::Tensor& e0, const at::Tensor& context,
                            const at::Tensor& cos, const at::Tensor& sin) {
  return RecomputedBlock::apply(x, e0, context, cos, sin, int64_t(reinterpret_cast<intptr_t>(&block)));
}

}  // namespace vidit

// Linear weights packed once for oneDNN on the CPU (see packed_linear.h).
#include "core/packed_linear.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

namespace vidit {
namespace {

// nullopt when this LibTorch has no oneDNN.
std::optional<c10::OperatorHandle> mkldnn_op(const char* name) {
  if (!at::hasMKLDNN()) return std::nullopt;
  return c10::Dispatcher::singleton().findSchema({name, ""});
}

at::Tensor call_boxed(const c10::OperatorHandle& op, torch::jit::Stack stack) {
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

const std::optional<c10::OperatorHandle>& reorder_op() {
  static const std::optional<c10::OperatorHandle> op = mkldnn_op("mkldnn::_reorder_linear_weight");
  return op;
}

const std::optional<c10::OperatorHandle>& linear_op() {
  static const std::optional<c10::OperatorHandle> op = mkldnn_op("mkldnn::_linear_pointwise");
  return op;
}

}  // namespace

PackedLinear::PackedLinear(at::Tensor weight, at::Tensor bias) : bias_(std::move(bias)) {
  if (weight.device().is_cpu() && weight.scalar_type() == at::kFloat && reorder_op() && linear_op()) {
    weight_ = call_boxed(*reorder_op(), {weight.contiguous(), c10::IValue()});
    packed_ = true;
  } else {
    weight_ = std::move(weight);
  }
}

at::Tensor PackedLinear::operator()(const at::Tensor& x) const {
  if (!packed_) return at::linear(x, weight_, bias_.defined() ? std::optional<at::Tensor>(bias_) : std::nullopt);
  return call_boxed(*linear_op(), {x.contiguous(), weight_, bias_.defined() ? c10::IValue(bias_) : c10::IValue(),
                                   c10::IValue("none"), c10::IValue(c10::List<std::optional<at::Scalar>>()),
                                   c10::IValue()});
}

}  // namespace vidit

#include "model/attention_backend.h"

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>

#include "core/error.h"

namespace vidit {

void select_attention_backend(AttentionBackend backend, const at::Device& device) {
  if (!device.is_cuda() && (backend == AttentionBackend::cudnn || backend == AttentionBackend::efficient))
    throw Error("train.attention_backend = \"" + name_of(backend) +
                      "\" needs CUDA; on the CPU use \"auto\", \"flash\" or \"math\"");
  at::Context& ctx = at::globalContext();
  const bool all = backend == AttentionBackend::automatic;
  ctx.setSDPUseFlash(all || backend == AttentionBackend::flash);
  ctx.setSDPUseMemEfficient(all || backend == AttentionBackend::efficient);
  ctx.setSDPUseCuDNN(all || backend == AttentionBackend::cudnn);
  ctx.setSDPUseMath(all || backend == AttentionBackend::math);
}

std::string attention_backend_for(int64_t batch, int64_t heads, int64_t tokens, int64_t head_dim,
                                  at::ScalarType dtype, const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  const at::Tensor q = at::empty({batch, heads, tokens, head_dim}, opts);
  int64_t choice = -1;
  try {
    choice = at::_fused_sdp_choice(q, q, q);
  } catch (const c10::Error& e) {
    throw Error("train.attention_backend: no enabled attention kernel takes this run's inputs (" +
                      std::to_string(heads) + " heads of " + std::to_string(head_dim) + ", " + std::to_string(tokens) +
                      " tokens, " + std::string(c10::toString(dtype)) + " on " + device.str() + "): " +
                      e.what_without_backtrace() + "; use \"auto\"");
  }
  switch (static_cast<at::SDPBackend>(choice)) {
    case at::SDPBackend::flash_attention: return "flash";
    case at::SDPBackend::efficient_attention: return "efficient";
    case at::SDPBackend::cudnn_attention: return "cudnn";
    case at::SDPBackend::math: return "math";
    default: return "unknown (" + std::to_string(choice) + ")";
  }
}

}  // namespace vidit

#include "model/lora.h"

#include <ATen/autocast_mode.h>
#include <torch/nn/init.h>

#include <cmath>
#include <set>

#include "core/error.h"
#include "model/fp8.h"
#include "model/weight_layout.h"

namespace vidit {
namespace {

// The buffer holding an fp8-stored base weight's row scales, on its projection.
constexpr const char* kBaseScale = "lora_base_scale";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A block's projections by official name, with the module of each and the linear-function slot
// it is multiplied through.
struct Projection {
  std::string name;
  Linear proj;
  LinearFn* slot;
};
std::vector<Projection> projections(DiTImpl& model) {
  std::vector<Projection> out;
  for (size_t i = 0; i < model.blocks->size(); ++i) {
    auto& b = *model.blocks[i]->as<DiTBlockImpl>();
    const std::string p = "blocks." + std::to_string(i) + ".";
    auto& sa = *b.self_attn;
    auto& ca = *b.cross_attn;
    using Named = std::pair<const char*, Linear>;
    for (const Named& n : {Named{"q", sa.q}, Named{"k", sa.k}, Named{"v", sa.v}, Named{"o", sa.o}})
      out.push_back({p + "self_attn." + n.first, n.second, &sa.linear_fn});
    for (const Named& n : {Named{"q", ca.q}, Named{"k", ca.k}, Named{"v", ca.v}, Named{"o", ca.o},
                           Named{"k_img", ca.k_img}, Named{"v_img", ca.v_img}})
      if (n.second) out.push_back({p + "cross_attn." + n.first, n.second, &ca.linear_fn});
    out.push_back({p + "ffn.0", b.fc1, &b.linear_fn});
    out.push_back({p + "ffn.2", b.fc2, &b.linear_fn});
  }
  return out;
}

bool matches(const std::string& name, const std::vector<std::string>& targets) {
  for (const std::string& t : targets)
    if (name == t || ends_with(name, "." + t)) return true;
  return false;
}

// One projection's adapter; `weight` is the frozen projection's own tensor, by which the linear
// function recognises the projection it is asked to multiply.
struct Adapter {
  at::Tensor weight, A, B;
  at::Tensor base_scale;  // lora.base_dtype = "fp8": the weight is e4m3 with this scale per row
};

// An fp8-stored base weight back in fp32 (its e4m3 values times its row scales).
at::Tensor stored_weight(const at::Tensor& w, const at::Tensor& base_scale) {
  return base_scale.defined() ? from_fp8(Fp8Tensor{w, base_scale}) : w;
}

LinearFn with_adapters(LinearFn inner, std::vector<Adapter> adapters, double scale, double dropout) {
  return [inner = std::move(inner), adapters = std::move(adapters), scale, dropout](
             const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    const Adapter* mine = nullptr;
    for (const Adapter& a : adapters)
      if (w.is_same(a.weight)) mine = &a;
    // An fp8-stored base weight is multiplied as fp32, made for this call only.
    const at::Tensor wt = mine ? stored_weight(w, mine->base_scale) : w;
    at::Tensor y;
    if (inner) {
      y = inner(x, wt, b);
    } else {
      // Frozen weights stored in bf16 multiply an fp32 input in fp32 (autocast casts by itself).
      const bool cast = wt.scalar_type() != x.scalar_type() && !at::autocast::is_autocast_enabled(x.device().type());
      y = at::linear(x, cast ? wt.to(x.scalar_type()) : wt, b);
    }
    if (!mine) return y;
    const at::Tensor h = dropout > 0 && at::GradMode::is_enabled() ? at::dropout(x, dropout, true) : x;
    return y + at::linear(at::linear(h, mine->A), mine->B) * scale;
  };
}

}  // namespace

std::vector<std::string> lora_matches(const DiTImpl& model, const std::vector<std::string>& targets) {
  std::vector<std::string> out;
  for (const Projection& p : projections(const_cast<DiTImpl&>(model)))
    if (matches(p.name, targets)) out.push_back(p.name);
  return out;
}

LoraCounts lora_counts(const ModelConfig& model, const LoraConfig& cfg) {
  LoraCounts c;
  if (cfg.rank <= 0) return c;
  static const std::set<std::string> kinds = {"self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q",
                                              "cross_attn.k", "cross_attn.v", "cross_attn.o", "cross_attn.k_img",
                                              "cross_attn.v_img", "ffn.0", "ffn.2"};
  for (const auto& [name, shape] : transformer_shapes(model)) {
    if (name.rfind("blocks.", 0) != 0 || !ends_with(name, ".weight") || shape.size() != 2) continue;
    const std::string proj = name.substr(0, name.size() - 7);
    const std::string kind = proj.substr(proj.find('.', 7) + 1);  // after "blocks.N."
    if (!kinds.count(kind) || !matches(proj, cfg.targets)) continue;
    c.projections += 1;
    c.adapter_params += cfg.rank * (shape[0] + shape[1]);
    c.adapted_weights += shape[0] * shape[1];
    c.adapted_rows += shape[0];
  }
  return c;
}

double lora_scale(const LoraConfig& cfg) {
  VIDIT_CHECK(cfg.rank > 0, "lora.rank must be > 0 for a scale");
  return (cfg.alpha > 0 ? cfg.alpha : double(cfg.rank)) / double(cfg.rank);
}

TensorMap apply_lora(DiTImpl& model, const LoraConfig& cfg) {
  VIDIT_CHECK(cfg.rank > 0, "apply_lora: lora.rank must be > 0");
  const std::vector<Projection> all = projections(model);
  std::vector<Projection> chosen;
  for (const Projection& p : all)
    if (matches(p.name, cfg.targets)) chosen.push_back(p);
  if (chosen.empty()) {
    std::string want, have;
    for (const auto& t : cfg.targets) want += (want.empty() ? "\"" : ", \"") + t + "\"";
    for (size_t i = 0; i < all.size() && i < 10; ++i) have += (i ? ", " : "") + all[i].name;
    fail("lora.targets [", want, "] match none of the blocks' projections; they are named like ", have,
         " (a target matches a name equal to it or ending in \".\" + the target, e.g. \"self_attn.q\", \"ffn.0\")");
  }
  at::NoGradGuard no_grad;
  for (auto& p : model.parameters()) p.requires_grad_(false);
  const double scale = lora_scale(cfg);
  std::map<LinearFn*, std::vector<Adapter>> by_slot;
  TensorMap out;
  for (Projection& p : chosen) {
    at::Tensor& w = p.proj->weight;
    const auto opts = w.options().dtype(at::kFloat);
    at::Tensor A = at::empty({cfg.rank, w.size(1)}, opts);
    torch::nn::init::kaiming_uniform_(A, std::sqrt(5.0));
    at::Tensor B = at::zeros({w.size(0), cfg.rank}, opts);
    A.requires_grad_(true), B.requires_grad_(true);
    at::Tensor base_scale;
    if (cfg.base_dtype == Precision::bf16) {
      w.set_data(w.to(at::kBFloat16));
    } else if (cfg.base_dtype == Precision::fp8) {
      // e4m3 with a scale per output row; the scale is kept on the projection as a buffer, so the
      // weight can be read back (lora_base_weights) and moves with the module.
      const Fp8Tensor q = to_fp8(w.to(at::kFloat), at::kFloat8_e4m3fn, /*rowwise=*/true);
      w.set_data(q.data);
      base_scale = p.proj->register_buffer(kBaseScale, q.scale);
    }
    by_slot[p.slot].push_back({w, A, B, base_scale});
    out[p.name + ".lora_A.weight"] = A;
    out[p.name + ".lora_B.weight"] = B;
  }
  for (auto& [slot, adapters] : by_slot) *slot = with_adapters(*slot, std::move(adapters), scale, cfg.dropout);
  return out;
}

TensorMap lora_base_weights(const DiTImpl& model) {
  TensorMap out;
  for (const auto& item : model.named_parameters(true)) out[item.key()] = item.value().detach();
  for (const Projection& p : projections(const_cast<DiTImpl&>(model))) {
    const auto buffers = p.proj->named_buffers(/*recurse=*/false);
    if (const at::Tensor* s = buffers.find(kBaseScale)) out[p.name + ".weight"] = stored_weight(p.proj->weight.detach(), *s);
  }
  return out;
}

bool holds_lora(const TensorMap& tensors) {
  for (const auto& [k, t] : tensors)
    if (ends_with(k, ".lora_A.weight")) return true;
  return false;
}

std::map<std::string, LoraPair> lora_pairs(const TensorMap& adapters, const TensorMap& base) {
  std::map<std::string, LoraPair> out;
  for (const auto& [key, A] : adapters) {
    if (!ends_with(key, ".lora_A.weight")) continue;
    const std::string proj = key.substr(0, key.size() - std::string(".lora_A.weight").size());
    auto b = adapters.find(proj + ".lora_B.weight");
    VIDIT_CHECK(b != adapters.end(), "LoRA adapter '", proj, "' has lora_A but no lora_B");
    auto w = base.find(proj + ".weight");
    VIDIT_CHECK(w != base.end(), "LoRA adapter '", proj, "' adapts a projection the base weights lack ('", proj,
                ".weight'): are they the weights this adapter was trained on?");
    const at::Tensor& W = w->second;
    const at::Tensor& B = b->second;
    VIDIT_CHECK(A.dim() == 2 && B.dim() == 2 && B.size(1) == A.size(0) && W.dim() == 2 && B.size(0) == W.size(0) &&
                    A.size(1) == W.size(1),
                "LoRA adapter '", proj, "': lora_A ", A.sizes(), " and lora_B ", B.sizes(), " do not fit the weight ",
                W.sizes(), " (want A [r, in], B [out, r])");
    out.emplace(proj + ".weight", LoraPair{A, B});
  }
  return out;
}

at::Tensor merge_lora_weight(const at::Tensor& W, const LoraPair& adapter, double scale) {
  at::NoGradGuard no_grad;
  // W + scale * (B A), the product scaled and W added in place of a second and a third
  // temporary: the same operations on the same values, so the same bits.
  at::Tensor merged = at::mm(adapter.B.detach().to(W.device(), at::kFloat), adapter.A.detach().to(W.device(), at::kFloat));
  merged.mul_(scale).add_(W.detach().to(at::kFloat));
  return merged.to(W.scalar_type());
}

TensorMap merge_lora(const TensorMap& base, const TensorMap& adapters, double scale) {
  TensorMap out = base;
  for (const auto& [weight, adapter] : lora_pairs(adapters, base)) out[weight] = merge_lora_weight(base.at(weight), adapter, scale);
  return out;
}

TensorMap lora_file_tensors(const TensorMap& adapters, double scale, at::ScalarType dtype) {
  TensorMap out;
  for (const auto& [key, t] : adapters) {
    out["diffusion_model." + key] = t.detach().to(at::kCPU, dtype).contiguous();
    if (ends_with(key, ".lora_A.weight")) {
      const std::string proj = key.substr(0, key.size() - std::string(".lora_A.weight").size());
      out["diffusion_model." + proj + ".alpha"] = at::scalar_tensor(double(t.size(0)) * scale, at::kFloat);
    }
  }
  return out;
}

TensorMap lora_from_file_tensors(const TensorMap& file, const std::string& source) {
  // By projection: down (A), up (B), alpha.
  struct Parts {
    at::Tensor down, up, alpha;
  };
  std::map<std::string, Parts> parts;
  const std::string prefix = "diffusion_model.";
  for (const auto& [raw, t] : file) {
    std::string key = raw.rfind(prefix, 0) == 0 ? raw.substr(prefix.size()) : raw;
    if (ends_with(key, ".lora_A.weight") || ends_with(key, ".lora_down.weight"))
      parts[key.substr(0, key.rfind(".lora_"))].down = t;
    else if (ends_with(key, ".lora_B.weight") || ends_with(key, ".lora_up.weight"))
      parts[key.substr(0, key.rfind(".lora_"))].up = t;
    else if (ends_with(key, ".alpha"))
      parts[key.substr(0, key.size() - 6)].alpha = t;
    else
      fail(source, ": '", raw, "' is not a LoRA tensor (want <projection>.lora_A.weight / .lora_B.weight / .alpha, "
           "or lora_down / lora_up)");
  }
  TensorMap out;
  for (auto& [proj, p] : parts) {
    VIDIT_CHECK(p.down.defined() && p.up.defined(), source, ": the LoRA of '", proj, "' lacks its ",
                p.down.defined() ? "lora_B (up)" : "lora_A (down)", " matrix");
    VIDIT_CHECK(p.down.dim() == 2 && p.up.dim() == 2 && p.up.size(1) == p.down.size(0), source, ": the LoRA of '",
                proj, "' has lora_A ", p.down.sizes(), " and lora_B ", p.up.sizes(), " (want [r, in] and [out, r])");
    const double scale = p.alpha.defined() ? p.alpha.to(at::kDouble).item<double>() / double(p.down.size(0)) : 1.0;
    out[proj + ".lora_A.weight"] = p.down.to(at::kFloat);
    out[proj + ".lora_B.weight"] = p.up.to(at::kFloat) * scale;
  }
  return out;
}

}  // namespace vidit

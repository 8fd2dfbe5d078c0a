#include "train/run_weights.h"

#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/unallocated.h"
#include "model/dit.h"
#include "model/experts.h"
#include "model/init.h"
#include "model/lora.h"
#include "model/state_dict.h"
#include "model/weight_layout.h"
#include "parallel/parallel_model.h"
#include "checkpoint/checkpoint.h"

namespace vidit {

namespace fs = std::filesystem;

bool is_vidit_checkpoint_path(const std::string& path) {
  return fs::is_directory(fs::path(path) / "checkpoints") || fs::exists(fs::path(path) / "meta.json");
}

namespace {

// A release (any path weight_layout.h's read_transformer_weights takes) as a stream: its files
// memory-mapped, each tensor a view of them, read from disk as it is used.
TensorStream release_stream(const std::string& path) {
  std::vector<std::shared_ptr<const MappedFile>> files;  // kept alive by the views themselves
  return stream_of(read_transformer_weights(path, &files));
}

// The weights DiTImpl::init_weights(seed) gives a model of `model`'s shape, one tensor at a time:
// the same rule, seed and elements (model/init.h), so the same values.
TensorStream initial_stream(const ModelConfig& model, uint64_t seed) {
  auto info = std::make_shared<std::map<std::string, TensorInfo>>();
  {
    const DiT shapes = dit_without_storage(model, at::kCPU);  // names, shapes and dtypes; no memory
    for (const auto& item : shapes->named_parameters(true)) info->emplace(item.key(), TensorInfo::of(item.value()));
  }
  TensorStream s;
  s.info = *info;
  s.read = [info, model, seed](const std::string& key) {
    const TensorInfo& i = info->at(key);
    at::Tensor t = at::empty(i.shape, at::TensorOptions().dtype(i.dtype));
    fill_initial(t, wan_init_rule(key, i.shape, model), seed, key, whole_region(i.shape));
    return t;
  };
  return s;
}

// `base` with `adapters` merged into the weights they adapt, each as it is read. The adapters
// are checked against the base's shapes first.
TensorStream with_adapters(const TensorStream& base, const TensorMap& adapters, double scale) {
  auto pairs = std::make_shared<const std::map<std::string, LoraPair>>(lora_pairs(adapters, meta_tensors(base)));
  TensorStream s;
  s.info = base.info;  // merge_lora_weight keeps each weight's dtype
  s.read = [base, pairs, scale](const std::string& key) {
    at::Tensor t = base.get(key);
    auto it = pairs->find(key);
    return it == pairs->end() ? t : merge_lora_weight(t, it->second, scale);
  };
  return s;
}

}  // namespace

CheckpointStream open_checkpoint_weights(const std::string& from, bool use_ema) {
  CheckpointStream w;
  w.checkpoint = from;
  if (fs::is_directory(fs::path(from) / "checkpoints")) {
    auto latest = latest_checkpoint(from);
    VIDIT_CHECK(latest, "'", from, "' is a run folder with no committed checkpoint under checkpoints/");
    w.checkpoint = *latest;
  }
  VIDIT_CHECK(fs::exists(fs::path(w.checkpoint) / "meta.json"), "'", from,
              "' is neither a run folder (with checkpoints/) nor a checkpoint (with meta.json)");
  auto reader = std::make_shared<const CheckpointReader>(w.checkpoint);
  w.step = reader->meta().step;
  w.config = parse_config(reader->meta().config_toml, w.checkpoint + "/meta.json");
  w.ema = use_ema && reader->has("ema") && !reader->keys("ema").empty();
  const std::string what = w.ema ? "ema" : "model";
  const TensorMap shapes = reader->shapes(what);
  TensorStream saved;
  for (const auto& [key, t] : shapes) saved.info.emplace(key, TensorInfo::of(t));
  saved.read = [reader, what](const std::string& key) { return reader->whole(what, key); };
  if (!holds_lora(shapes)) {
    w.weights = std::move(saved);
    return w;
  }
  VIDIT_CHECK(w.config.lora.rank > 0, w.checkpoint, " holds LoRA adapters but its config has lora.rank = 0");
  w.adapters = read_all(saved);
  w.lora_scale = lora_scale(w.config.lora);
  const std::string& base = w.config.train.init_from;
  TensorStream base_weights;
  if (base.empty()) {
    // The trainer's own random init for the run's seed (model/init.h: the same values at any mesh).
    base_weights = initial_stream(w.config.model, uint64_t(w.config.train.seed));
  } else {
    VIDIT_CHECK(fs::exists(base), w.checkpoint, " is a LoRA run on the base weights '", base,
                "' (its train.init_from), which are no longer there: put them back, or edit train.init_from in ",
                w.checkpoint, "/meta.json's config to where they are now");
    // A two-expert release: the run's own expert (model/experts.h).
    base_weights = is_vidit_checkpoint_path(base) ? open_checkpoint_weights(base).weights
                                                  : release_stream(expert_init_path(w.config));
  }
  w.weights = with_adapters(base_weights, w.adapters, w.lora_scale);
  return w;
}

CheckpointWeights read_checkpoint_weights(const std::string& from, bool use_ema) {
  CheckpointStream s = open_checkpoint_weights(from, use_ema);
  CheckpointWeights w;
  w.weights = read_all(s.weights);
  static_cast<CheckpointSource&>(w) = std::move(static_cast<CheckpointSource&>(s));
  return w;
}

TensorMap read_any_weights(const std::string& path) {
  if (is_vidit_checkpoint_path(path)) return read_checkpoint_weights(path).weights;
  return read_weights(path);
}

int64_t InitWeights::file_bytes() const {
  int64_t n = 0;
  for (const auto& f : files) n += int64_t(f->size());
  return n;
}

int64_t InitWeights::read_bytes() const {
  int64_t n = 0;
  for (const auto& f : files) {
    const int64_t r = f->resident_bytes();
    if (r < 0) return -1;
    n += r;
  }
  return n;
}

InitWeights open_init_weights(const Config& cfg) {
  InitWeights w;
  w.from = expert_init_path(cfg);  // with train.expert and a two-expert release: that expert's folder
  // A release's config.json, when there is one, must agree with the run's model on what the
  // weights cannot show (their shapes are checked by name when they are loaded): RoPE's base and
  // the text length. A vidit run or checkpoint gives its EMA weights (a LoRA run's merged onto its base).
  std::optional<ModelConfig> r;
  if (is_vidit_checkpoint_path(w.from)) {
    CheckpointWeights c = read_checkpoint_weights(w.from);
    r = c.config.model, w.weights = std::move(c.weights);
  } else {
    if (!find_transformer_weights(w.from).config.empty()) r = read_transformer_config(w.from);
    w.weights = read_transformer_weights(w.from, &w.files);
  }
  VIDIT_CHECK(!r || (r->rope_theta == cfg.model.rope_theta && r->text_len == cfg.model.text_len), "train.init_from '",
              w.from, "' was trained with rope_theta ", r->rope_theta, " and text_len ", r->text_len,
              " (its config); this run has model.rope_theta = ", cfg.model.rope_theta, " and model.text_len = ",
              cfg.model.text_len, ": set them to match");
  return w;
}

void load_init_parts(const ParallelModel& pm, const InitWeights& w) {
  check_state_dict(pm.whole_shapes(), w.weights, w.from);
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : pm.params()) {
    allocate(p);  // a part built without storage
    p.copy_(pm.local(name, w.weights.at(name)));
  }
}

}  // namespace vidit

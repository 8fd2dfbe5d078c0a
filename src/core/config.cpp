// TOML → typed Config. Each section is read through a Binder that type-checks every key it
// knows and afterwards refuses the keys it does not, suggesting the closest known one.
#include "core/config.h"

#include <toml++/toml.h>

#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>

#include "core/error.h"

namespace vidit {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& k : known) {
    size_t d = edit_distance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  return best;
}

// Reads the keys of one [section], checking each value's type.
class Binder {
 public:
  Binder(const toml::table& root, std::string section, std::string file)
      : section_(std::move(section)), file_(std::move(file)) {
    if (auto* node = root.get(section_)) {
      table_ = node->as_table();
      VIDIT_CHECK(table_, file_, ": '", section_, "' must be a table ([", section_, "])");
    }
  }

  void get(const char* key, int64_t& out) {
    if (auto* n = find(key)) {
      auto v = n->value<int64_t>();
      if (!n->is_integer() || !v) type_error(key, "an integer", *n);
      out = *v;
    }
  }
  void get(const char* key, uint64_t& out) {
    if (auto* n = find(key)) {
      if (!n->is_integer() || *n->value<int64_t>() < 0) type_error(key, "a non-negative integer", *n);
      out = static_cast<uint64_t>(*n->value<int64_t>());
    }
  }
  void get(const char* key, double& out) {
    if (auto* n = find(key)) {
      if (!n->is_number()) type_error(key, "a number", *n);
      out = *n->value<double>();
    }
  }
  void get(const char* key, bool& out) {
    if (auto* n = find(key)) {
      if (!n->is_boolean()) type_error(key, "true or false", *n);
      out = *n->value<bool>();
    }
  }
  void get(const char* key, std::string& out) {
    if (auto* n = find(key)) {
      if (!n->is_string()) type_error(key, "a string", *n);
      out = *n->value<std::string>();
    }
  }
  void get(const char* key, std::array<int64_t, 3>& out) {
    if (auto* n = find(key)) {
      auto* arr = n->as_array();
      if (!arr || arr->size() != 3) type_error(key, "an array of 3 integers", *n);
      for (size_t i = 0; i < 3; ++i) {
        auto v = (*arr)[i].value<int64_t>();
        if (!(*arr)[i].is_integer() || !v) type_error(key, "an array of 3 integers", *n);
        out[i] = *v;
      }
    }
  }

  template <typename T>
  void get(const char* key, std::vector<T>& out) {
    if (auto* n = find(key)) {
      constexpr bool integral = std::is_integral_v<T>;
      const char* want = integral ? "an array of integers" : "an array of numbers";
      auto* arr = n->as_array();
      if (!arr) type_error(key, want, *n);
      out.clear();
      for (const auto& e : *arr) {
        if (integral ? !e.is_integer() : !e.is_number()) type_error(key, want, *n);
        out.push_back(*e.value<T>());
      }
    }
  }

  // Refuses keys this section does not know.
  void finish() const {
    if (!table_) return;
    for (auto&& [k, v] : *table_) {
      std::string key(k.str());
      if (std::find(known_.begin(), known_.end(), key) == known_.end())
        fail(file_, ": unknown key '", section_, ".", key, "'; did you mean '", section_, ".",
             closest(key, known_), "'?");
    }
  }

 private:
  const toml::node* find(const char* key) {
    known_.push_back(key);
    return table_ ? table_->get(key) : nullptr;
  }
  [[noreturn]] void type_error(const char* key, const char* want, const toml::node& n) const {
    std::ostringstream got;
    got << n.type();
    fail(file_, ": key '", section_, ".", key, "' must be ", want, " (got ", got.str(), ")");
  }

  std::string section_, file_;
  const toml::table* table_ = nullptr;
  std::vector<std::string> known_;
};

const std::vector<std::string> kSections = {"model", "data", "buckets", "diffusion", "train", "sample", "demo",
                                            "parallel"};

void apply_override(toml::table& root, const std::string& item) {
  auto eq = item.find('=');
  VIDIT_CHECK(eq != std::string::npos, "--set '", item, "': expected section.key=value");
  std::string path = item.substr(0, eq), value = item.substr(eq + 1);
  auto dot = path.find('.');
  VIDIT_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < path.size(), "--set '", item,
              "': the key must be section.key, e.g. train.lr=1e-4");
  std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  if (std::find(kSections.begin(), kSections.end(), section) == kSections.end())
    fail("--set '", item, "': unknown section '", section, "'; did you mean '",
         closest(section, kSections), "'?");
  if (!root.contains(section)) root.insert(section, toml::table{});
  auto* tbl = root[section].as_table();
  VIDIT_CHECK(tbl, "--set '", item, "': '", section, "' is not a table");
  // The value is TOML (numbers, booleans, arrays, quoted strings); bare words are strings.
  try {
    toml::table parsed = toml::parse("v = " + value);
    tbl->insert_or_assign(key, *parsed.get("v"));
  } catch (const toml::parse_error&) {
    tbl->insert_or_assign(key, value);
  }
}

}  // namespace

int64_t head_dim(const ModelConfig& m) { return m.heads > 0 ? m.dim / m.heads : 0; }

int64_t tokens_per_sample(const Config& c) {
  return (c.data.latent_frames / c.model.patch[0]) * (c.data.latent_height / c.model.patch[1]) *
         (c.data.latent_width / c.model.patch[2]);
}

Config parse_config(const std::string& text, const std::string& source,
                    const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    fail(source, ":", e.source().begin.line, ":", e.source().begin.column, ": ", e.description());
  }
  for (const auto& o : overrides) apply_override(root, o);
  for (auto&& [k, v] : root) {
    std::string key(k.str());
    if (std::find(kSections.begin(), kSections.end(), key) == kSections.end())
      fail(source, ": unknown section '", key, "'; did you mean '", closest(key, kSections), "'?");
  }

  Config c;
  c.source = source;
  {
    Binder b(root, "model", source);
    auto& m = c.model;
    b.get("dim", m.dim); b.get("ffn_dim", m.ffn_dim); b.get("heads", m.heads);
    b.get("layers", m.layers); b.get("in_channels", m.in_channels);
    b.get("out_channels", m.out_channels); b.get("patch", m.patch);
    b.get("text_dim", m.text_dim); b.get("text_len", m.text_len); b.get("freq_dim", m.freq_dim);
    b.get("eps", m.eps); b.get("rope_theta", m.rope_theta);
    b.finish();
  }
  {
    Binder b(root, "data", source);
    auto& d = c.data;
    b.get("source", d.source); b.get("latent_frames", d.latent_frames);
    b.get("latent_height", d.latent_height); b.get("latent_width", d.latent_width);
    b.get("manifest", d.manifest); b.get("cache_dir", d.cache_dir); b.get("codec", d.codec);
    b.get("vae_weights", d.vae_weights); b.get("text_encoder", d.text_encoder);
    b.get("decoder", d.decoder); b.get("fps", d.fps); b.get("decode_threads", d.decode_threads);
    b.get("square_pixels", d.square_pixels); b.get("encode_device", d.encode_device);
    b.get("shard_mb", d.shard_mb); b.get("cache_dtype", d.cache_dtype);
    b.get("token_budget", d.token_budget); b.get("loader_threads", d.loader_threads);
    b.get("prefetch", d.prefetch);
    b.finish();
  }
  {
    Binder b(root, "buckets", source);
    auto& k = c.buckets;
    b.get("resolutions", k.resolutions); b.get("aspect_ratios", k.aspect_ratios);
    b.get("frames", k.frames); b.get("frame_stride", k.frame_stride); b.get("multiple", k.multiple);
    b.get("max_upscale", k.max_upscale);
    b.finish();
  }
  {
    Binder b(root, "diffusion", source);
    auto& d = c.diffusion;
    b.get("timestep_sampling", d.timestep_sampling); b.get("logit_mean", d.logit_mean);
    b.get("logit_std", d.logit_std); b.get("shift", d.shift);
    b.get("text_drop_prob", d.text_drop_prob);
    b.finish();
  }
  {
    Binder b(root, "train", source);
    auto& t = c.train;
    b.get("steps", t.steps); b.get("batch_size", t.batch_size); b.get("grad_accum", t.grad_accum);
    b.get("lr", t.lr); b.get("min_lr_ratio", t.min_lr_ratio); b.get("warmup_steps", t.warmup_steps);
    b.get("schedule", t.schedule); b.get("weight_decay", t.weight_decay);
    b.get("beta1", t.beta1); b.get("beta2", t.beta2); b.get("adam_eps", t.adam_eps);
    b.get("grad_clip", t.grad_clip); b.get("ema_decay", t.ema_decay); b.get("seed", t.seed);
    b.get("precision", t.precision); b.get("device", t.device); b.get("out_dir", t.out_dir); b.get("log_every", t.log_every);
    b.get("ckpt_every", t.ckpt_every); b.get("keep_checkpoints", t.keep_checkpoints);
    b.get("threads", t.threads); b.get("trace_steps", t.trace_steps);
    b.get("recompute_blocks", t.recompute_blocks); b.get("peak_tflops", t.peak_tflops); b.get("init_from", t.init_from);
    b.finish();
  }
  {
    Binder b(root, "sample", source);
    auto& s = c.sample;
    b.get("steps", s.steps); b.get("shift", s.shift); b.get("cfg_scale", s.cfg_scale);
    b.get("seed", s.seed);
    b.finish();
  }
  {
    Binder b(root, "demo", source);
    auto& d = c.demo;
    b.get("videos", d.videos); b.get("frame_size", d.frame_size); b.get("frames", d.frames);
    b.get("codec_block", d.codec_block); b.get("text_dim", d.text_dim);
    b.get("samples_per_prompt", d.samples_per_prompt);
    b.get("eval_every", d.eval_every); b.get("colourless_captions", d.colourless_captions);
    b.finish();
  }
  {
    Binder b(root, "parallel", source);
    auto& p = c.parallel;
    b.get("replicate", p.replicate); b.get("shard", p.shard); b.get("tensor", p.tensor);
    b.get("ulysses", p.ulysses); b.get("ring", p.ring); b.get("bucket_mb", p.bucket_mb);
    b.get("reshard_after_forward", p.reshard_after_forward); b.get("reduce_dtype", p.reduce_dtype);
    b.get("prefetch", p.prefetch);
    b.finish();
  }
  validate_config(c);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return parse_config("", "<defaults>", overrides);
  std::ifstream in(path);
  VIDIT_CHECK(in, "cannot open config file '", path, "': check the path (configs/ has examples)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides);
}

void validate_config(const Config& c) {
  const auto& m = c.model;
  const std::string& f = c.source;
  auto positive = [&](const char* key, int64_t v) {
    VIDIT_CHECK(v > 0, f, ": '", key, "' must be > 0 (got ", v, ")");
  };
  positive("model.dim", m.dim); positive("model.ffn_dim", m.ffn_dim);
  positive("model.heads", m.heads); positive("model.layers", m.layers);
  positive("model.in_channels", m.in_channels); positive("model.out_channels", m.out_channels);
  positive("model.text_dim", m.text_dim); positive("model.text_len", m.text_len);
  positive("model.freq_dim", m.freq_dim);
  for (int i = 0; i < 3; ++i) positive("model.patch", m.patch[i]);
  VIDIT_CHECK(m.dim % m.heads == 0, f, ": model.dim (", m.dim, ") must be divisible by model.heads (",
              m.heads, "); e.g. set model.heads to a divisor of ", m.dim);
  int64_t hd = m.dim / m.heads;
  VIDIT_CHECK(hd % 2 == 0 && hd >= 6, f, ": head dim model.dim/model.heads = ", hd,
              " must be even and >= 6 so 3D RoPE can split it over t, h, w");
  VIDIT_CHECK(m.freq_dim % 2 == 0, f, ": model.freq_dim must be even (got ", m.freq_dim, ")");
  const auto& d = c.data;
  VIDIT_CHECK(d.source == "demo" || d.source == "synthetic" || d.source == "cache", f,
              ": data.source must be \"demo\", \"synthetic\" or \"cache\" (got \"", d.source, "\")");
  VIDIT_CHECK(d.codec == "demo" || d.codec == "wan_vae", f, ": data.codec must be \"demo\" or \"wan_vae\" (got \"",
              d.codec, "\")");
  VIDIT_CHECK(d.text_encoder == "demo" || d.text_encoder == "precomputed", f,
              ": data.text_encoder must be \"demo\" or \"precomputed\" (got \"", d.text_encoder, "\")");
  VIDIT_CHECK(d.encode_device == "auto" || d.encode_device == "cpu" || d.encode_device == "cuda", f,
              ": data.encode_device must be \"auto\", \"cpu\" or \"cuda\" (got \"", d.encode_device, "\")");
  VIDIT_CHECK(d.decoder == "auto" || d.decoder == "cpu" || d.decoder == "nvdec", f,
              ": data.decoder must be \"auto\", \"cpu\" or \"nvdec\" (got \"", d.decoder, "\")");
  VIDIT_CHECK(d.cache_dtype == "bf16" || d.cache_dtype == "fp32", f,
              ": data.cache_dtype must be \"bf16\" or \"fp32\" (got \"", d.cache_dtype, "\")");
  VIDIT_CHECK(d.fps >= 0, f, ": data.fps must be >= 0 (0 keeps the source rate)");
  VIDIT_CHECK(d.decode_threads >= 0 && d.token_budget >= 0, f, ": data.decode_threads and data.token_budget must be >= 0");
  positive("data.shard_mb", d.shard_mb); positive("data.loader_threads", d.loader_threads);
  positive("data.prefetch", d.prefetch);
  VIDIT_CHECK(d.source != "cache" || !d.cache_dir.empty(), f,
              ": data.source = \"cache\" needs data.cache_dir (the folder `vidit prepare` wrote)");
  positive("data.latent_frames", d.latent_frames); positive("data.latent_height", d.latent_height);
  positive("data.latent_width", d.latent_width);
  const char* axis[3] = {"latent_frames", "latent_height", "latent_width"};
  int64_t size[3] = {d.latent_frames, d.latent_height, d.latent_width};
  for (int i = 0; i < 3; ++i)
    VIDIT_CHECK(size[i] % m.patch[i] == 0, f, ": data.", axis[i], " (", size[i],
                ") is not divisible by the patch size ", m.patch[i], " along that axis; change one of them");
  const auto& df = c.diffusion;
  VIDIT_CHECK(df.timestep_sampling == "uniform" || df.timestep_sampling == "logit_normal", f,
              ": diffusion.timestep_sampling must be \"uniform\" or \"logit_normal\" (got \"",
              df.timestep_sampling, "\")");
  VIDIT_CHECK(df.shift > 0, f, ": diffusion.shift must be > 0");
  VIDIT_CHECK(df.logit_std > 0, f, ": diffusion.logit_std must be > 0");
  VIDIT_CHECK(df.text_drop_prob >= 0 && df.text_drop_prob <= 1, f,
              ": diffusion.text_drop_prob must be in [0, 1]");
  const auto& t = c.train;
  positive("train.steps", t.steps); positive("train.batch_size", t.batch_size);
  positive("train.grad_accum", t.grad_accum); positive("train.log_every", t.log_every);
  positive("train.keep_checkpoints", t.keep_checkpoints);
  VIDIT_CHECK(t.lr > 0, f, ": train.lr must be > 0");
  VIDIT_CHECK(t.warmup_steps >= 0 && t.ckpt_every >= 0 && t.threads >= 0, f,
              ": train.warmup_steps, train.ckpt_every and train.threads must be >= 0");
  VIDIT_CHECK(t.schedule == "cosine" || t.schedule == "constant", f,
              ": train.schedule must be \"cosine\" or \"constant\" (got \"", t.schedule, "\")");
  VIDIT_CHECK(t.device == "auto" || t.device == "cpu" || t.device == "cuda", f,
              ": train.device must be \"auto\", \"cpu\" or \"cuda\" (got \"", t.device, "\")");
  VIDIT_CHECK(t.precision == "fp32" || t.precision == "bf16", f,
              ": train.precision must be \"fp32\" or \"bf16\" (got \"", t.precision, "\")");
  VIDIT_CHECK(t.ema_decay >= 0 && t.ema_decay < 1, f, ": train.ema_decay must be in [0, 1)");
  VIDIT_CHECK(t.grad_clip >= 0, f, ": train.grad_clip must be >= 0");
  VIDIT_CHECK(t.peak_tflops >= 0, f, ": train.peak_tflops must be >= 0 (0: from the GPU's name)");
  VIDIT_CHECK(t.recompute_blocks >= -1, f, ": train.recompute_blocks must be -1 (all), 0 (none) or a block count (got ",
              t.recompute_blocks, ")");
  VIDIT_CHECK(t.trace_steps >= 0, f, ": train.trace_steps must be >= 0 (got ", t.trace_steps, ")");
  positive("sample.steps", c.sample.steps);
  VIDIT_CHECK(c.sample.shift > 0, f, ": sample.shift must be > 0");
  const auto& dm = c.demo;
  positive("demo.videos", dm.videos); positive("demo.frame_size", dm.frame_size);
  positive("demo.frames", dm.frames); positive("demo.codec_block", dm.codec_block);
  positive("demo.text_dim", dm.text_dim); positive("demo.samples_per_prompt", dm.samples_per_prompt);
  VIDIT_CHECK(dm.eval_every >= 0, f, ": demo.eval_every must be >= 0 (got ", dm.eval_every, ")");
  VIDIT_CHECK(dm.colourless_captions >= 0 && dm.colourless_captions <= 1, f,
              ": demo.colourless_captions must be in [0, 1] (got ", dm.colourless_captions, ")");
  const auto& pc = c.parallel;
  positive("parallel.replicate", pc.replicate); positive("parallel.shard", pc.shard);
  positive("parallel.tensor", pc.tensor); positive("parallel.ulysses", pc.ulysses);
  positive("parallel.ring", pc.ring);
  VIDIT_CHECK(pc.bucket_mb > 0, f, ": parallel.bucket_mb must be > 0 (got ", pc.bucket_mb, ")");
  VIDIT_CHECK(pc.reduce_dtype == "fp32" || pc.reduce_dtype == "bf16", f,
              ": parallel.reduce_dtype must be \"fp32\" or \"bf16\" (got \"", pc.reduce_dtype, "\")");
  if (d.source == "demo") {
    VIDIT_CHECK(dm.frame_size % dm.codec_block == 0, f, ": demo.frame_size (", dm.frame_size,
                ") must be divisible by demo.codec_block (", dm.codec_block, ")");
    int64_t ch = 3 * dm.codec_block * dm.codec_block, lat = dm.frame_size / dm.codec_block;
    VIDIT_CHECK(m.in_channels == ch && m.out_channels == ch, f,
                ": the demo codec gives 3*codec_block^2 = ", ch,
                " latent channels; set model.in_channels and model.out_channels to ", ch);
    VIDIT_CHECK(d.latent_frames == dm.frames && d.latent_height == lat && d.latent_width == lat, f,
                ": the demo codec gives latents of (", dm.frames, ", ", lat, ", ", lat,
                "); set data.latent_frames/latent_height/latent_width to match");
    VIDIT_CHECK(m.text_dim == dm.text_dim, f, ": model.text_dim must equal demo.text_dim (",
                dm.text_dim, ") when data.source = \"demo\"");
  }
}

std::string config_to_toml(const Config& c) {
  std::ostringstream os;
  os << std::setprecision(10);
  auto s = [](const std::string& v) { return "\"" + v + "\""; };
  const auto& m = c.model;
  os << "[model]\ndim = " << m.dim << "\nffn_dim = " << m.ffn_dim << "\nheads = " << m.heads
     << "\nlayers = " << m.layers << "\nin_channels = " << m.in_channels
     << "\nout_channels = " << m.out_channels << "\npatch = [" << m.patch[0] << ", " << m.patch[1]
     << ", " << m.patch[2] << "]\ntext_dim = " << m.text_dim << "\ntext_len = " << m.text_len
     << "\nfreq_dim = " << m.freq_dim << "\neps = " << m.eps << "\nrope_theta = " << m.rope_theta;
  const auto& d = c.data;
  os << "\n\n[data]\nsource = " << s(d.source) << "\nlatent_frames = " << d.latent_frames
     << "\nlatent_height = " << d.latent_height << "\nlatent_width = " << d.latent_width
     << "\nmanifest = " << s(d.manifest) << "\ncache_dir = " << s(d.cache_dir) << "\ncodec = " << s(d.codec)
     << "\nvae_weights = " << s(d.vae_weights) << "\ntext_encoder = " << s(d.text_encoder)
     << "\ndecoder = " << s(d.decoder) << "\nfps = " << d.fps << "\ndecode_threads = " << d.decode_threads
     << "\nsquare_pixels = " << (d.square_pixels ? "true" : "false") << "\nencode_device = " << s(d.encode_device)
     << "\nshard_mb = " << d.shard_mb << "\ncache_dtype = " << s(d.cache_dtype)
     << "\ntoken_budget = " << d.token_budget << "\nloader_threads = " << d.loader_threads
     << "\nprefetch = " << d.prefetch;
  auto list = [](const auto& v) {
    std::ostringstream o;
    o << std::setprecision(10) << "[";
    for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
    return o.str() + "]";
  };
  const auto& k = c.buckets;
  os << "\n\n[buckets]\nresolutions = " << list(k.resolutions) << "\naspect_ratios = " << list(k.aspect_ratios)
     << "\nframes = " << list(k.frames) << "\nframe_stride = " << k.frame_stride << "\nmultiple = " << k.multiple
     << "\nmax_upscale = " << k.max_upscale;
  const auto& f = c.diffusion;
  os << "\n\n[diffusion]\ntimestep_sampling = " << s(f.timestep_sampling)
     << "\nlogit_mean = " << f.logit_mean << "\nlogit_std = " << f.logit_std
     << "\nshift = " << f.shift << "\ntext_drop_prob = " << f.text_drop_prob;
  const auto& t = c.train;
  os << "\n\n[train]\nsteps = " << t.steps << "\nbatch_size = " << t.batch_size
     << "\ngrad_accum = " << t.grad_accum << "\nlr = " << t.lr << "\nmin_lr_ratio = " << t.min_lr_ratio
     << "\nwarmup_steps = " << t.warmup_steps << "\nschedule = " << s(t.schedule)
     << "\nweight_decay = " << t.weight_decay << "\nbeta1 = " << t.beta1 << "\nbeta2 = " << t.beta2
     << "\nadam_eps = " << t.adam_eps << "\ngrad_clip = " << t.grad_clip
     << "\nema_decay = " << t.ema_decay << "\nseed = " << t.seed << "\nprecision = " << s(t.precision) << "\ndevice = " << s(t.device)
     << "\nout_dir = " << s(t.out_dir) << "\nlog_every = " << t.log_every
     << "\nckpt_every = " << t.ckpt_every << "\nkeep_checkpoints = " << t.keep_checkpoints
     << "\nthreads = " << t.threads << "\npeak_tflops = " << t.peak_tflops << "\nrecompute_blocks = " << t.recompute_blocks << "\ntrace_steps = " << t.trace_steps << "\ninit_from = " << s(t.init_from);
  const auto& sp = c.sample;
  os << "\n\n[sample]\nsteps = " << sp.steps << "\nshift = " << sp.shift
     << "\ncfg_scale = " << sp.cfg_scale << "\nseed = " << sp.seed;
  const auto& dm = c.demo;
  os << "\n\n[demo]\nvideos = " << dm.videos << "\nframe_size = " << dm.frame_size
     << "\nframes = " << dm.frames << "\ncodec_block = " << dm.codec_block
     << "\ntext_dim = " << dm.text_dim << "\nsamples_per_prompt = " << dm.samples_per_prompt
     << "\neval_every = " << dm.eval_every << "\ncolourless_captions = " << dm.colourless_captions;
  const auto& pc = c.parallel;
  os << "\n\n[parallel]\nreplicate = " << pc.replicate << "\nshard = " << pc.shard << "\ntensor = " << pc.tensor
     << "\nulysses = " << pc.ulysses << "\nring = " << pc.ring << "\nbucket_mb = " << pc.bucket_mb
     << "\nreshard_after_forward = " << (pc.reshard_after_forward ? "true" : "false")
     << "\nprefetch = " << (pc.prefetch ? "true" : "false")
     << "\nreduce_dtype = " << s(pc.reduce_dtype) << "\n";
  return os.str();
}

}  // namespace vidit

// TOML <-> typed Config, all of it derived from the key lists in config.h: visit() walks every
// key (section, name, field, check, doc) in declaration order, and reading, checking, writing and
// the reference are each one loop over it.
#include "core/config.h"

#include <toml++/toml.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <type_traits>

#include "core/error.h"

namespace vidit {

std::vector<std::string> enum_spellings(std::string_view enumerators) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) out.push_back(cur == "automatic" ? "auto" : cur);
    cur.clear();
  };
  for (char ch : enumerators) {
    if (ch == ',') flush();
    else if (ch != ' ') cur += ch;
  }
  flush();
  return out;
}

namespace {

template <class T>
inline constexpr bool is_config_enum = requires { EnumNames<T>::names(); };

// ---- checks of one key's value: nullptr, or what the value must be ----------------------------
namespace key_checks {
// Applies `ok` to a number or to every element of a list.
template <class T, class Ok>
bool holds(const T& v, Ok ok) {
  if constexpr (std::is_same_v<T, Patch> || std::is_same_v<T, IntList> || std::is_same_v<T, NumList>) {
    for (const auto& e : v)
      if (!ok(double(e))) return false;
    return true;
  } else if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    return ok(double(v));
  } else {
    return true;
  }
}
template <class T> const char* any(const T&) { return nullptr; }
template <class T> const char* positive(const T& v) { return holds(v, [](double x) { return x > 0; }) ? nullptr : "> 0"; }
template <class T> const char* non_negative(const T& v) { return holds(v, [](double x) { return x >= 0; }) ? nullptr : ">= 0"; }
template <class T> const char* fraction(const T& v) { return holds(v, [](double x) { return x >= 0 && x <= 1; }) ? nullptr : "in [0, 1]"; }
template <class T> const char* below_one(const T& v) { return holds(v, [](double x) { return x >= 0 && x < 1; }) ? nullptr : "in [0, 1)"; }
template <class T> const char* block_count(const T& v) {
  return holds(v, [](double x) { return x >= -1; }) ? nullptr : "-1 (all), 0 (none) or a block count";
}
template <class T> const char* even_positive(const T& v) {
  return holds(v, [](double x) { return x > 0 && int64_t(x) % 2 == 0; }) ? nullptr : "even and > 0";
}
template <class T> const char* fp32_or_bf16(const T& v) {
  if constexpr (std::is_same_v<T, Precision>) return v == Precision::fp32 || v == Precision::bf16 ? nullptr : "\"fp32\" or \"bf16\"";
  return nullptr;
}
template <class T> const char* fp32_bf16_or_fp8(const T& v) {
  if constexpr (std::is_same_v<T, Precision>)
    return v == Precision::fp32 || v == Precision::bf16 || v == Precision::fp8 ? nullptr : "\"fp32\", \"bf16\" or \"fp8\"";
  return nullptr;
}
}  // namespace key_checks

// Every key of `c` (a Config or a const Config), in declaration order:
// f(section, name, field, check, doc).
#define VIDIT_VISIT(type, name, value, check, doc) f(section, #name, s.name, &key_checks::check<type>, doc);
template <class C, class F>
void visit(C& c, F&& f) {
  { const char* section = "model"; auto& s = c.model; VIDIT_MODEL_KEYS(VIDIT_VISIT) }
  { const char* section = "data"; auto& s = c.data; VIDIT_DATA_KEYS(VIDIT_VISIT) }
  { const char* section = "buckets"; auto& s = c.buckets; VIDIT_BUCKET_KEYS(VIDIT_VISIT) }
  { const char* section = "diffusion"; auto& s = c.diffusion; VIDIT_DIFFUSION_KEYS(VIDIT_VISIT) }
  { const char* section = "train"; auto& s = c.train; VIDIT_TRAIN_KEYS(VIDIT_VISIT) }
  { const char* section = "checkpoint"; auto& s = c.checkpoint; VIDIT_CHECKPOINT_KEYS(VIDIT_VISIT) }
  { const char* section = "sample"; auto& s = c.sample; VIDIT_SAMPLE_KEYS(VIDIT_VISIT) }
  { const char* section = "text"; auto& s = c.text; VIDIT_TEXT_KEYS(VIDIT_VISIT) }
  { const char* section = "lora"; auto& s = c.lora; VIDIT_LORA_KEYS(VIDIT_VISIT) }
  { const char* section = "demo"; auto& s = c.demo; VIDIT_DEMO_KEYS(VIDIT_VISIT) }
  { const char* section = "parallel"; auto& s = c.parallel; VIDIT_PARALLEL_KEYS(VIDIT_VISIT) }
  { const char* section = "faults"; auto& s = c.faults; VIDIT_FAULT_KEYS(VIDIT_VISIT) }
}
#undef VIDIT_VISIT

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

// The sections, and each one's keys, from the declarations.
const std::vector<std::string>& sections() {
  static const std::vector<std::string> out = [] {
    std::vector<std::string> v;
    Config c;
    visit(c, [&](const char* section, const char*, auto&, auto, const char*) {
      if (v.empty() || v.back() != section) v.push_back(section);
    });
    return v;
  }();
  return out;
}

std::vector<std::string> keys_of(const std::string& section) {
  std::vector<std::string> v;
  Config c;
  visit(c, [&](const char* s, const char* name, auto&, auto, const char*) {
    if (section == s) v.push_back(name);
  });
  return v;
}

// What a value of type T is, for messages and the reference: "an integer", "one of ...".
template <class T>
std::string type_name() {
  if constexpr (std::is_same_v<T, int64_t>) return "an integer";
  else if constexpr (std::is_same_v<T, uint64_t>) return "a non-negative integer";
  else if constexpr (std::is_same_v<T, double>) return "a number";
  else if constexpr (std::is_same_v<T, bool>) return "true or false";
  else if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_same_v<T, Patch>) return "an array of 3 integers";
  else if constexpr (std::is_same_v<T, IntList>) return "an array of integers";
  else if constexpr (std::is_same_v<T, NumList>) return "an array of numbers";
  else if constexpr (std::is_same_v<T, StrList>) return "an array of strings";
  else {
    static_assert(is_config_enum<T>);
    std::string s;
    for (const auto& n : EnumNames<T>::names()) s += (s.empty() ? "one of \"" : ", \"") + n + "\"";
    return s;
  }
}

[[noreturn]] void type_error(const std::string& file, const std::string& key, const std::string& want,
                             const toml::node& n) {
  std::ostringstream got;
  got << n.type();
  if (n.is_string()) got << " \"" << *n.value<std::string>() << "\"";
  fail(file, ": key '", key, "' must be ", want, " (got ", got.str(), ")");
}

// One value from its TOML node, type-checked.
template <class T>
void read_value(const toml::node& n, T& out, const std::string& key, const std::string& file) {
  const std::string want = type_name<T>();
  if constexpr (std::is_same_v<T, int64_t>) {
    if (!n.is_integer()) type_error(file, key, want, n);
    out = *n.value<int64_t>();
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    if (!n.is_integer() || *n.value<int64_t>() < 0) type_error(file, key, want, n);
    out = uint64_t(*n.value<int64_t>());
  } else if constexpr (std::is_same_v<T, double>) {
    if (!n.is_number()) type_error(file, key, want, n);
    out = *n.value<double>();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!n.is_boolean()) type_error(file, key, want, n);
    out = *n.value<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!n.is_string()) type_error(file, key, want, n);
    out = *n.value<std::string>();
  } else if constexpr (std::is_same_v<T, Patch> || std::is_same_v<T, IntList> || std::is_same_v<T, NumList>) {
    const toml::array* arr = n.as_array();
    if (!arr || (std::is_same_v<T, Patch> && arr->size() != 3)) type_error(file, key, want, n);
    std::vector<typename T::value_type> v;
    for (const auto& e : *arr) {
      if (std::is_same_v<T, NumList> ? !e.is_number() : !e.is_integer()) type_error(file, key, want, n);
      v.push_back(*e.value<typename T::value_type>());
    }
    if constexpr (std::is_same_v<T, Patch>) std::copy(v.begin(), v.end(), out.begin());
    else out = v;
  } else if constexpr (std::is_same_v<T, StrList>) {
    const toml::array* arr = n.as_array();
    if (!arr) type_error(file, key, want, n);
    StrList v;
    for (const auto& e : *arr) {
      if (!e.is_string()) type_error(file, key, want, n);
      v.push_back(*e.value<std::string>());
    }
    out = v;
  } else {
    const auto& names = EnumNames<T>::names();
    if (!n.is_string()) type_error(file, key, want, n);
    const std::string got = *n.value<std::string>();
    auto it = std::find(names.begin(), names.end(), got);
    VIDIT_CHECK(it != names.end(), file, ": key '", key, "' must be ", want, " (got \"", got, "\"; did you mean \"",
                closest(got, names), "\"?)");
    out = T(it - names.begin());
  }
}

// A value as a TOML node.
template <class T>
void write_value(toml::table& t, const char* name, const T& v) {
  if constexpr (std::is_same_v<T, uint64_t>) {
    t.insert(name, int64_t(v));
  } else if constexpr (std::is_same_v<T, Patch> || std::is_same_v<T, IntList> || std::is_same_v<T, NumList> ||
                       std::is_same_v<T, StrList>) {
    toml::array a;
    for (const auto& e : v) a.push_back(e);
    t.insert(name, a);
  } else if constexpr (is_config_enum<T>) {
    t.insert(name, name_of(v));
  } else {
    t.insert(name, v);
  }
}

void apply_override(toml::table& root, const std::string& item) {
  auto eq = item.find('=');
  VIDIT_CHECK(eq != std::string::npos, "--set '", item, "': expected section.key=value");
  std::string path = item.substr(0, eq), value = item.substr(eq + 1);
  auto dot = path.find('.');
  VIDIT_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < path.size(), "--set '", item,
              "': the key must be section.key, e.g. train.lr=1e-4");
  std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  const auto& known = sections();
  if (std::find(known.begin(), known.end(), section) == known.end())
    fail("--set '", item, "': unknown section '", section, "'; did you mean '", closest(section, known), "'?");
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

// Keys that moved: [train] ckpt_* and keep_* are [checkpoint]'s now. An old name is read as the
// new one, with a warning naming it; both at once is an error.
void move_renamed_keys(toml::table& root, const std::string& source) {
  static const std::pair<const char*, const char*> moved[] = {
      {"ckpt_every", "every"},         {"ckpt_every_minutes", "every_minutes"}, {"ckpt_async", "async"},
      {"ckpt_snapshots", "snapshots"}, {"ckpt_timeout_s", "timeout_s"},         {"ckpt_failures_max", "failures_max"},
      {"keep_checkpoints", "keep"},    {"keep_every", "keep_every"}};
  toml::table* train = root["train"].as_table();
  if (!train) return;
  for (const auto& [old_name, new_name] : moved) {
    toml::node* value = train->get(old_name);
    if (!value) continue;
    if (!root.contains("checkpoint")) root.insert("checkpoint", toml::table{});
    toml::table* ckpt = root["checkpoint"].as_table();
    VIDIT_CHECK(ckpt, source, ": 'checkpoint' must be a table ([checkpoint])");
    VIDIT_CHECK(!ckpt->contains(new_name), source, ": train.", old_name, " and checkpoint.", new_name,
                " are both set; train.", old_name, " is the old name of checkpoint.", new_name, ": keep only that");
    value->visit([&](const auto& v) { ckpt->insert(new_name, v); });
    train->erase(old_name);
    std::fprintf(stderr, "%s: train.%s is now checkpoint.%s ([checkpoint] section); read as that, rename it\n",
                 source.c_str(), old_name, new_name);
  }
}

}  // namespace

int64_t head_dim(const ModelConfig& m) { return m.heads > 0 ? m.dim / m.heads : 0; }

int64_t tokens_per_sample(const Config& c) {
  return (c.data.latent_frames / c.model.patch[0]) * (c.data.latent_height / c.model.patch[1]) *
         (c.data.latent_width / c.model.patch[2]);
}

Config parse_config(const std::string& text, const std::string& source, const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    fail(source, ":", e.source().begin.line, ":", e.source().begin.column, ": ", e.description());
  }
  for (const auto& o : overrides) apply_override(root, o);
  move_renamed_keys(root, source);
  const auto& known = sections();
  for (auto&& [k, v] : root) {
    const std::string section(k.str());
    VIDIT_CHECK(std::find(known.begin(), known.end(), section) != known.end(), source, ": unknown section '", section,
                "'; did you mean '", closest(section, known), "'?");
    const toml::table* t = v.as_table();
    VIDIT_CHECK(t, source, ": '", section, "' must be a table ([", section, "])");
    const std::vector<std::string> names = keys_of(section);
    for (auto&& [key, value] : *t) {
      const std::string name(key.str());
      VIDIT_CHECK(std::find(names.begin(), names.end(), name) != names.end(), source, ": unknown key '", section, ".",
                  name, "'; did you mean '", section, ".", closest(name, names), "'?");
    }
  }
  Config c;
  c.source = source;
  visit(c, [&](const char* section, const char* name, auto& field, auto check, const char*) {
    const std::string key = std::string(section) + "." + name;
    if (const toml::node* n = root.at_path(key).node()) read_value(*n, field, key, source);
  });
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
  const std::string& f = c.source;
  // Each key's own check (config.h), then the relations between keys.
  visit(c, [&](const char* section, const char* name, const auto& field, auto check, const char* doc) {
    if (const char* must = check(field)) {
      std::ostringstream got;
      using T = std::decay_t<decltype(field)>;
      if constexpr (std::is_arithmetic_v<T>) {
        got << " (got " << field << ")";
      } else if constexpr (std::is_same_v<T, Patch> || std::is_same_v<T, IntList> || std::is_same_v<T, NumList>) {
        got << " (got [";
        for (size_t i = 0; i < field.size(); ++i) got << (i ? ", " : "") << field[i];
        got << "])";
      }
      fail(f, ": '", section, ".", name, "' must be ", must, got.str(), "; ", section, ".", name, ": ", doc);
    }
  });
  VIDIT_CHECK(c.checkpoint.snapshots <= 2, f, ": checkpoint.snapshots must be 0, 1 or 2 (got ", c.checkpoint.snapshots,
              "): a save snapshots into one set while at most one earlier save is written from the other");
  const auto& m = c.model;
  VIDIT_CHECK(m.dim % m.heads == 0, f, ": model.dim (", m.dim, ") must be divisible by model.heads (", m.heads,
              "); e.g. set model.heads to a divisor of ", m.dim);
  const int64_t hd = m.dim / m.heads;
  VIDIT_CHECK(hd % 2 == 0 && hd >= 6, f, ": head dim model.dim/model.heads = ", hd,
              " must be even and >= 6 so 3D RoPE can split it over t, h, w");
  // Wan 2.1's image-to-video appends the mask and the condition's latent to the noisy latent;
  // Wan 2.2 TI2V keeps its first frame in the latent itself (diffusion/frame_condition.h).
  const bool keeps_first = m.condition == FrameCondition::first_frame && m.in_channels == m.out_channels;
  if (m.condition != FrameCondition::none && !keeps_first)
    VIDIT_CHECK(m.in_channels == 2 * m.out_channels + 4, f, ": model.condition = \"",
                name_of(m.condition), "\" takes the noisy latent, a 4-channel "
                "mask and the condition's latent: model.in_channels must be 2 * model.out_channels + 4 = ",
                2 * m.out_channels + 4, " (got ", m.in_channels, ")",
                m.condition == FrameCondition::first_frame ? ", or equal to model.out_channels for a model that keeps "
                                                            "the first frame in its latent (Wan 2.2 TI2V)" : "");
  VIDIT_CHECK(!keeps_first || (m.patch[0] == 1 && m.image_dim == 0), f, ": a model that keeps its first frame in "
              "the latent (Wan 2.2 TI2V: model.condition = \"first_frame\", in_channels = out_channels) takes "
              "model.patch's time 1 and no CLIP features (model.image_dim = 0)");
  VIDIT_CHECK(m.condition == FrameCondition::none || keeps_first || c.data.source == DataSource::cache, f, ": model.condition = \"",
              name_of(m.condition), "\" trains from a latent cache that holds each clip's condition frames: set "
              "data.source = \"cache\" and prepare it with this config (vidit prepare)");
  VIDIT_CHECK(c.train.expert == Expert::none || m.boundary > 0, f, ": train.expert = \"", name_of(c.train.expert),
              "\" trains one expert of a two-expert model, but model.boundary = 0 (one model): set model.boundary "
              "to the release's boundary_ratio (Wan 2.2: 0.875 text-to-video, 0.9 image-to-video) or drop train.expert");
  VIDIT_CHECK(c.train.expert == Expert::none || c.sample.every == 0, f, ": sample.every with train.expert = \"",
              name_of(c.train.expert), "\": a video needs both experts; export the run into its release "
              "(vidit export RUN OUT --pipeline RELEASE) and sample that");
  const auto& d = c.data;
  VIDIT_CHECK(d.source != DataSource::cache || !d.cache_dir.empty(), f,
              ": data.source = \"cache\" needs data.cache_dir (the folder `vidit prepare` wrote)");
  // Validation (train/validation.h): a part of the cache or a cache of its own, at noise levels
  // strictly between clean and pure noise.
  VIDIT_CHECK(d.val_fraction == 0 || d.val_cache.empty(), f, ": data.val_fraction = ", d.val_fraction,
              " and data.val_cache = '", d.val_cache, "' both name a validation set; keep one");
  VIDIT_CHECK((d.val_fraction == 0 && d.val_cache.empty()) || d.source != DataSource::synthetic, f,
              ": validation (data.val_fraction / data.val_cache) needs clips to hold out, and data.source = "
              "\"synthetic\" has none: use data.source = \"cache\" or \"demo\"");
  VIDIT_CHECK(d.val_fraction < 1, f, ": data.val_fraction = 1 holds out every clip and leaves none to train on; "
              "take a fraction such as 0.01, or set data.val_cache");
  VIDIT_CHECK(!c.train.val_sigmas.empty(), f, ": train.val_sigmas is empty; give the noise levels to validate at, "
              "e.g. [0.1, 0.3, 0.5, 0.7, 0.9]");
  for (double s : c.train.val_sigmas)
    VIDIT_CHECK(s > 0 && s < 1, f, ": train.val_sigmas holds ", s, "; each noise level must lie in (0, 1)");
  // The Wan 2.2 VAE compresses 16x16 pixels into one latent cell.
  VIDIT_CHECK(d.codec != Codec::wan22_vae || c.buckets.multiple % 16 == 0, f, ": data.codec = \"wan22_vae\" makes "
              "one latent cell of 16x16 pixels: buckets.multiple (", c.buckets.multiple, ") must be a multiple of 16");
  VIDIT_CHECK(d.codec != Codec::wan22_vae || c.buckets.frame_stride == 4, f, ": data.codec = \"wan22_vae\" makes "
              "one latent frame of 4 video frames after the first: set buckets.frame_stride = 4 (got ",
              c.buckets.frame_stride, ")");
  const char* axis[3] = {"latent_frames", "latent_height", "latent_width"};
  const int64_t size[3] = {d.latent_frames, d.latent_height, d.latent_width};
  for (int i = 0; i < 3; ++i)
    VIDIT_CHECK(size[i] % m.patch[i] == 0, f, ": data.", axis[i], " (", size[i],
                ") is not divisible by the patch size ", m.patch[i], " along that axis; change one of them");
  const auto& dm = c.demo;
  if (d.source == DataSource::demo) {
    VIDIT_CHECK(dm.frame_size % dm.codec_block == 0, f, ": demo.frame_size (", dm.frame_size,
                ") must be divisible by demo.codec_block (", dm.codec_block, ")");
    const int64_t ch = 3 * dm.codec_block * dm.codec_block, lat = dm.frame_size / dm.codec_block;
    VIDIT_CHECK(m.in_channels == ch && m.out_channels == ch, f, ": the demo codec gives 3*codec_block^2 = ", ch,
                " latent channels; set model.in_channels and model.out_channels to ", ch);
    VIDIT_CHECK(d.latent_frames == dm.frames && d.latent_height == lat && d.latent_width == lat, f,
                ": the demo codec gives latents of (", dm.frames, ", ", lat, ", ", lat,
                "); set data.latent_frames/latent_height/latent_width to match");
    VIDIT_CHECK(m.text_dim == dm.text_dim, f, ": model.text_dim must equal demo.text_dim (", dm.text_dim,
                ") when data.source = \"demo\"");
  }
  VIDIT_CHECK(d.clip_stride_seconds == 0 || d.clip_seconds > 0, f,
              ": data.clip_stride_seconds needs data.clip_seconds (the length of each clip)");
  const auto& l = c.lora;
  if (l.rank > 0) {
    VIDIT_CHECK(!l.targets.empty(), f, ": lora.targets is empty: name the projections that get adapters, e.g. "
                "[\"self_attn.q\", \"self_attn.v\"]");
    const auto& p = c.parallel;
    VIDIT_CHECK(p.tensor == 1 && p.shard == 1 && !p.apply_all, f,
                ": LoRA (lora.rank > 0) trains with data parallel (parallel.replicate) and sequence parallel "
                "(parallel.ulysses, parallel.ring); set parallel.tensor and parallel.shard to 1 (the frozen "
                "weights are held whole on every rank; only the adapters train)");
  }
}

std::string config_to_toml(const Config& c) {
  toml::table root;
  visit(c, [&](const char* section, const char* name, const auto& field, auto, const char*) {
    if (!root.contains(section)) root.insert(section, toml::table{});
    write_value(*root[section].as_table(), name, field);
  });
  std::ostringstream os;
  os << root << "\n";
  return os.str();
}

std::string config_reference() {
  std::ostringstream os;
  os << "# Configuration keys\n\n"
     << "Every key `vidit` reads, by section, with its type and default (generated by `vidit keys`\n"
     << "from the declarations in `src/core/config.h`; a test keeps this file equal to its output).\n"
     << "Set them in a TOML file (`-c`) or with `--set section.key=value`.\n";
  const Config defaults;
  std::string current;
  visit(defaults, [&](const char* section, const char* name, const auto& field, auto, const char* doc) {
    using T = std::decay_t<decltype(field)>;
    if (current != section) {
      current = section;
      os << "\n## [" << section << "]\n\n| key | type | default | |\n|---|---|---|---|\n";
    }
    toml::table one;
    write_value(one, "v", field);
    std::ostringstream value;
    one.get("v")->visit([&](const auto& x) { value << x; });
    std::string d = value.str();
    if (d.empty()) d = "\"\"";
    std::string text = doc;
    for (size_t at = text.find('|'); at != std::string::npos; at = text.find('|', at + 2)) text.replace(at, 1, "\\|");
    os << "| `" << name << "` | " << type_name<T>() << " | `" << d << "` | " << text << " |\n";
  });
  return os.str();
}

}  // namespace vidit

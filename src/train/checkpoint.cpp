#include "train/checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/mapped_file.h"

namespace vidit {
namespace fs = std::filesystem;

namespace {

std::string step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}

// The file of shard `index` of `count`, of tensor-parallel part `t` of `parts` (parts > 1).
std::string part_name(const char* what, int64_t index, int64_t count, int64_t t = 0, int64_t parts = 1) {
  char name[128];
  if (parts > 1)
    std::snprintf(name, sizeof name, "%s.tp-%05lld-of-%05lld.shard-%05lld-of-%05lld.safetensors", what, (long long)t,
                  (long long)parts, (long long)index, (long long)count);
  else
    std::snprintf(name, sizeof name, "%s.shard-%05lld-of-%05lld.safetensors", what, (long long)index, (long long)count);
  return name;
}

}  // namespace

std::string checkpoint_tmp_dir(const std::string& out_dir, int64_t step) {
  return (fs::path(out_dir) / "checkpoints" / (step_name(step) + ".tmp")).string();
}

std::string begin_checkpoint(const std::string& out_dir, int64_t step) {
  fs::create_directories(fs::path(out_dir) / "checkpoints");
  fs::path tmp = checkpoint_tmp_dir(out_dir, step);
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  return tmp.string();
}

void write_checkpoint_shard(const std::string& tmp_dir, const CheckpointState& s, int64_t index, int64_t tensor_index) {
  fs::path tmp(tmp_dir);
  auto name = [&](const char* what) {
    return (tmp / (s.shards > 0 ? part_name(what, index, s.shards, tensor_index, s.tensor)
                                : std::string(what) + ".safetensors")).string();
  };
  save_safetensors(name("model"), s.model);
  if (!s.ema.empty()) save_safetensors(name("ema"), s.ema);
  save_safetensors(name("optimizer"), s.optimizer);
}

std::string commit_checkpoint(const std::string& out_dir, const CheckpointState& s, int64_t keep) {
  fs::path root = fs::path(out_dir) / "checkpoints";
  const std::string name = step_name(s.step);
  fs::path final_dir = root / name, tmp = root / (name + ".tmp");
  nlohmann::json meta = {{"format", "vidit-checkpoint-1"},
                         {"step", s.step},
                         {"ema_updates", s.ema_updates},
                         {"sampler", {{"seed", s.sampler.seed}, {"epoch", s.sampler.epoch},
                                      {"position", s.sampler.position}}},
                         {"config", s.config_toml}};
  if (s.shards > 0) meta["shards"] = {{"count", s.shards}, {"shapes", s.shapes}};
  if (s.tensor > 1) meta["tensor"] = {{"count", s.tensor}, {"split", s.split}};
  write_file_atomic((tmp / "meta.json").string(), meta.dump(2));
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  write_file_atomic((root / "latest").string(), name + "\n");

  // Prune the oldest complete checkpoints beyond `keep` (never the one just written).
  std::vector<fs::path> all;
  for (const auto& e : fs::directory_iterator(root)) {
    std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step_", 0) == 0 && n.find(".tmp") == std::string::npos)
      all.push_back(e.path());
  }
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i + keep < all.size(); ++i)
    if (all[i] != final_dir) fs::remove_all(all[i]);
  return final_dir.string();
}

std::string save_checkpoint(const std::string& out_dir, const CheckpointState& s, int64_t keep) {
  write_checkpoint_shard(begin_checkpoint(out_dir, s.step), s, 0);
  return commit_checkpoint(out_dir, s, keep);
}

std::optional<std::string> latest_checkpoint(const std::string& out_dir) {
  fs::path pointer = fs::path(out_dir) / "checkpoints" / "latest";
  std::ifstream in(pointer);
  if (!in) return std::nullopt;
  std::string name;
  std::getline(in, name);
  fs::path dir = pointer.parent_path() / name;
  VIDIT_CHECK(!name.empty() && fs::is_directory(dir), "'", pointer.string(), "' points to '", name,
              "' which does not exist: remove the pointer or restore the directory");
  return dir.string();
}

struct CheckpointReader::Part {
  std::unique_ptr<MappedFile> file;
  TensorMap tensors;  // views into the mapping
};

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  fs::path d(dir);
  CheckpointState& s = meta_;
  std::ifstream in(d / "meta.json");
  VIDIT_CHECK(in, "checkpoint '", dir, "' has no meta.json: it is incomplete or not a checkpoint");
  nlohmann::json meta;
  try {
    in >> meta;
    s.step = meta.at("step").get<int64_t>();
    s.ema_updates = meta.at("ema_updates").get<int64_t>();
    s.sampler.seed = meta.at("sampler").at("seed").get<uint64_t>();
    s.sampler.epoch = meta.at("sampler").at("epoch").get<int64_t>();
    s.sampler.position = meta.at("sampler").at("position").get<int64_t>();
    s.config_toml = meta.at("config").get<std::string>();
    if (meta.contains("shards")) {
      s.shards = meta.at("shards").at("count").get<int64_t>();
      s.shapes = meta.at("shards").at("shapes").get<std::map<std::string, std::vector<int64_t>>>();
    }
    if (meta.contains("tensor")) {
      s.tensor = meta.at("tensor").at("count").get<int64_t>();
      s.split = meta.at("tensor").at("split").get<std::map<std::string, int>>();
    }
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint '", (d / "meta.json").string(), "' is malformed: ", e.what());
  }
  const int64_t T = std::max<int64_t>(s.tensor, 1);
  for (const char* what : {"model", "ema", "optimizer"}) {
    // Whole tensors in one file, or parts: file t * shards + k.
    std::vector<fs::path> files;
    if (s.shards == 0) {
      files.push_back(d / (std::string(what) + ".safetensors"));
    } else {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < s.shards; ++k) files.push_back(d / part_name(what, k, s.shards, t, T));
    }
    if (std::string(what) == "ema" && !fs::exists(files[0])) continue;  // saved without EMA
    std::vector<Part>& parts = parts_[what];
    for (const fs::path& f : files) {
      VIDIT_CHECK(fs::exists(f), "checkpoint '", dir, "' lacks ", f.filename().string(),
                  files.size() > 1 ? " (" + std::to_string(files.size()) + " parts expected)" : std::string(),
                  ": it was not saved completely");
      Part p;
      p.file = std::make_unique<MappedFile>(f.string(), "checkpoint file");
      p.tensors = view_safetensors(p.file->data(), p.file->size(), f.string());
      parts.push_back(std::move(p));
    }
  }
}

CheckpointReader::~CheckpointReader() = default;

bool CheckpointReader::has(const std::string& what) const { return parts_.count(what) > 0; }

const std::vector<CheckpointReader::Part>& CheckpointReader::parts(const std::string& what) const {
  auto it = parts_.find(what);
  VIDIT_CHECK(it != parts_.end(), "checkpoint '", dir_, "' has no ", what, " state");
  return it->second;
}

std::vector<std::string> CheckpointReader::keys(const std::string& what) const {
  std::vector<std::string> out;
  for (const auto& [key, t] : parts(what)[0].tensors) out.push_back(key);
  return out;
}

// A key names a parameter, possibly behind a prefix ("exp_avg/<name>"), or nothing ("").
std::string CheckpointReader::param_of(const std::string& key) const {
  if (meta_.shapes.count(key)) return key;
  const size_t slash = key.find('/');
  if (slash != std::string::npos && meta_.shapes.count(key.substr(slash + 1))) return key.substr(slash + 1);
  return "";
}

// Sharded: each tensor-parallel part is put together from its FSDP chunks (in the shape recorded
// for it), then the parts are concatenated along their split dimension. Keys that name no
// parameter (the step count, the RNG states) are taken from the first part.
at::Tensor CheckpointReader::whole(const std::string& what, const std::string& key) const {
  const std::vector<Part>& ps = parts(what);
  auto first = ps[0].tensors.find(key);
  VIDIT_CHECK(first != ps[0].tensors.end(), "checkpoint '", dir_, "': ", what, " has no '", key, "'");
  const std::string name = meta_.shards > 0 ? param_of(key) : "";
  if (name.empty()) return first->second.clone();
  const std::vector<int64_t>& shape = meta_.shapes.at(name);
  int64_t numel = 1;
  for (int64_t n : shape) numel *= n;
  const int64_t T = std::max<int64_t>(meta_.tensor, 1), S = meta_.shards;
  std::vector<at::Tensor> pieces;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<at::Tensor> chunks;
    for (int64_t k = 0; k < S; ++k) {
      const TensorMap& p = ps[size_t(t * S + k)].tensors;
      auto it = p.find(key);
      VIDIT_CHECK(it != p.end(), "checkpoint '", dir_, "': a part of ", what, " lacks '", key, "'");
      chunks.push_back(it->second.flatten());
    }
    at::Tensor flat = at::cat(chunks);
    VIDIT_CHECK(flat.numel() >= numel, "checkpoint '", dir_, "': the parts of '", key, "' hold ", flat.numel(),
                " values, fewer than its shape needs (", numel, ")");
    pieces.push_back(flat.narrow(0, 0, numel).reshape(shape));
  }
  auto split = meta_.split.find(name);
  return T > 1 && split != meta_.split.end() ? at::cat(pieces, split->second) : pieces[0].clone();
}

TensorMap CheckpointReader::shapes(const std::string& what) const {
  TensorMap out;
  for (const auto& [key, t] : parts(what)[0].tensors) {
    const std::string name = meta_.shards > 0 ? param_of(key) : "";
    std::vector<int64_t> shape = name.empty() ? t.sizes().vec() : meta_.shapes.at(name);
    auto split = meta_.split.find(name);
    if (!name.empty() && meta_.tensor > 1 && split != meta_.split.end()) shape[size_t(split->second)] *= meta_.tensor;
    out[key] = at::empty(shape, at::TensorOptions().dtype(t.scalar_type()).device(at::kMeta));
  }
  return out;
}

CheckpointState load_checkpoint(const std::string& dir) {
  CheckpointReader r(dir);
  CheckpointState s = r.meta();
  for (const auto& key : r.keys("model")) s.model[key] = r.whole("model", key);
  if (r.has("ema"))
    for (const auto& key : r.keys("ema")) s.ema[key] = r.whole("ema", key);
  for (const auto& key : r.keys("optimizer")) s.optimizer[key] = r.whole("optimizer", key);
  return s;
}

}  // namespace vidit

#include "loader/latent_cache.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/mapped_file.h"
#include "core/safetensors.h"

namespace vidit {
namespace fs = std::filesystem;
namespace {

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t parse_hex64(const std::string& s, const std::string& where) {
  VIDIT_CHECK(s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos, where,
              ": checksum '", s, "' is not 16 hex digits");
  return std::stoull(s, nullptr, 16);
}

// Checksum of a sample: its tensors' bytes in a fixed order (image-to-video's condition latent and
// CLIP features last, so a text-to-video sample's checksum is what it always was).
uint64_t checksum(const at::Tensor& mean, const at::Tensor& std, const at::Tensor& text, const at::Tensor& cond = {},
                  const at::Tensor& image = {}) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  for (const at::Tensor* t : {&mean, &std, &text, &cond, &image})
    if (t->defined()) XXH3_64bits_update(st, t->data_ptr(), size_t(t->numel()) * t->element_size());
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

std::vector<CacheIndexEntry> read_index_file(const std::string& path) {
  std::ifstream in(path);
  VIDIT_CHECK(in, "cannot open cache index '", path, "': ", std::strerror(errno));
  std::vector<CacheIndexEntry> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      fail(where, ": not valid JSON (", e.what(), "); delete the line or re-run vidit prepare");
    }
    out.push_back(CacheIndexEntry::from_json(j, where));
  }
  return out;
}

std::vector<std::string> index_parts(const std::string& dir) {
  std::vector<std::string> parts;
  if (fs::is_directory(dir + "/index"))
    for (const auto& e : fs::directory_iterator(dir + "/index"))
      if (e.path().extension() == ".jsonl") parts.push_back(e.path().string());
  std::sort(parts.begin(), parts.end());
  return parts;
}

std::vector<CacheIndexEntry> merged_parts(const std::string& dir) {
  // Of each key, its latest revision (a re-captioned clip is written again with rev + 1).
  std::map<std::string, std::pair<CacheIndexEntry, std::string>> latest;  // key -> entry, its part
  for (const auto& p : index_parts(dir))
    for (auto& e : read_index_file(p)) {
      auto it = latest.find(e.key);
      if (it == latest.end()) {
        const std::string key = e.key;  // e is moved from below
        latest.emplace(key, std::make_pair(std::move(e), p));
        continue;
      }
      VIDIT_CHECK(it->second.first.rev != e.rev, "cache '", dir, "': sample '", e.key, "' is in both ",
                  it->second.second, " and ", p, " (revision ", e.rev,
                  "); remove one of the two index parts (and its shard) and re-run vidit prepare");
      if (e.rev > it->second.first.rev) it->second = std::make_pair(std::move(e), p);
    }
  std::vector<CacheIndexEntry> all;
  all.reserve(latest.size());
  for (auto& [key, entry] : latest) all.push_back(std::move(entry.first));  // a std::map: sorted by key
  return all;
}

}  // namespace

nlohmann::json CacheIndexEntry::to_json() const {
  nlohmann::json j{{"key", key}, {"shard", shard}, {"bucket", bucket}, {"shape", shape},
                   {"checksum", hex64(checksum)}, {"meta", meta}};
  if (!text_ref.empty()) j["text_ref"] = text_ref;
  if (rev > 0) j["rev"] = rev;
  if (!made.is_null()) j["made"] = made;
  if (cond) j["cond"] = true;
  if (!image_shape.empty()) j["image"] = image_shape;
  return j;
}

CacheIndexEntry CacheIndexEntry::from_json(const nlohmann::json& j, const std::string& where) {
  CacheIndexEntry e;
  try {
    e.key = j.at("key").get<std::string>();
    e.shard = j.at("shard").get<std::string>();
    e.bucket = j.at("bucket").get<std::string>();
    e.shape = j.at("shape").get<std::vector<int64_t>>();
    e.checksum = parse_hex64(j.at("checksum").get<std::string>(), where);
    e.meta = j.value("meta", nlohmann::json::object());
    e.text_ref = j.value("text_ref", std::string());
    e.rev = j.value("rev", int64_t(0));
    if (auto m = j.find("made"); m != j.end()) e.made = *m;
    e.cond = j.value("cond", false);
    if (auto im = j.find("image"); im != j.end()) e.image_shape = im->get<std::vector<int64_t>>();
  } catch (const nlohmann::json::exception& ex) {
    fail(where, ": bad cache index entry (", ex.what(), "); re-run vidit prepare to rewrite it");
  }
  VIDIT_CHECK(e.shape.size() == 4, where, ": latent shape must be [C, T, H, W]");
  return e;
}

at::Tensor read_text_embedding(const std::string& path) {
  TensorMap t = load_safetensors(path);
  VIDIT_CHECK(t.size() == 1 || t.count("text"), "text embedding file '", path,
              "' must hold one tensor or one named 'text'");
  return (t.count("text") ? t["text"] : t.begin()->second).to(at::kFloat);
}

std::string cache_key(const std::string& path, double start, double end) {
  std::ostringstream os;
  os.precision(17);
  os << path << '\0' << start << '\0' << end;
  const std::string s = os.str();
  return hex64(XXH3_64bits(s.data(), s.size()));
}

uint64_t caption_digest(const std::string& caption) { return XXH3_64bits(caption.data(), caption.size()); }

CacheSample read_cached_sample(const std::string& dir, const CacheIndexEntry& e) {
  const std::string path = dir + "/" + e.shard;
  MappedFile file(path, "cache shard", "re-run vidit prepare to rewrite it");
  const TensorMap t = view_safetensors(file.data(), file.size(), path);
  auto get = [&](const char* what) {
    auto it = t.find(e.key + "/" + what);
    VIDIT_CHECK(it != t.end(), "cache shard '", path, "' has no '", e.key, "/", what, "' (index and shard disagree)");
    return it->second.clone();  // the mapping goes with this function
  };
  CacheSample s;
  s.key = e.key, s.bucket = e.bucket, s.text_ref = e.text_ref, s.meta = e.meta, s.rev = e.rev, s.made = e.made;
  s.mean = get("mean"), s.std = get("std");
  if (e.text_ref.empty()) s.text = get("text");
  if (e.cond) s.cond = get("cond");
  if (!e.image_shape.empty()) s.image = get("image");
  if (checksum(s.mean, s.std, s.text, s.cond, s.image) != e.checksum)
    throw CacheCorruption("cache sample '" + e.key + "' in '" + path + "' fails its checksum (the shard is damaged)");
  return s;
}

// ---------------------------------------------------------------------------------------------
CacheWriter::CacheWriter(std::string dir, int worker, int64_t shard_bytes, at::ScalarType dtype)
    : dir_(std::move(dir)), worker_(worker), shard_bytes_(shard_bytes), dtype_(dtype) {
  VIDIT_CHECK(worker_ >= 0, "cache writer: worker must be >= 0");
  VIDIT_CHECK(shard_bytes_ > 0, "cache writer: shard size must be positive");
  fs::create_directories(dir_ + "/shards");
  fs::create_directories(dir_ + "/index");
  char prefix[16];
  std::snprintf(prefix, sizeof prefix, "w%03d-", worker_);
  for (const auto& p : index_parts(dir_)) {
    for (const auto& e : read_index_file(p)) {
      auto it = done_.find(e.key);
      if (it != done_.end() && it->second.rev >= e.rev) continue;
      done_[e.key] = CachedKey{e.rev, e.shard, e.text_ref, caption_digest(e.meta.value("caption", std::string())),
                               e.made.is_null() ? std::string() : e.made.dump(), e.meta.value("source", std::string())};
    }
    const std::string stem = fs::path(p).stem().string();
    if (stem.rfind(prefix, 0) == 0) next_shard_ = std::max<int64_t>(next_shard_, std::stoll(stem.substr(5)) + 1);
  }
}

CacheWriter::~CacheWriter() {
  try {
    flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[cache] could not write the last shard of '%s': %s\n", dir_.c_str(), e.what());
  }
}

void CacheWriter::add(const CacheSample& s) {
  VIDIT_CHECK(!s.key.empty() && s.key.find('/') == std::string::npos, "cache writer: bad key '", s.key, "'");
  VIDIT_CHECK(s.mean.defined() && s.std.defined() && s.mean.dim() == 4 && s.mean.sizes() == s.std.sizes(),
              "cache writer: sample '", s.key, "' needs mean and std of the same shape [C, T, H, W]");
  VIDIT_CHECK(s.text.defined() != !s.text_ref.empty(), "cache writer: sample '", s.key,
              "' needs exactly one of a text tensor and a text_ref");
  auto cached = done_.find(s.key);
  if (cached != done_.end() && cached->second.rev >= s.rev) return;
  at::Tensor mean = s.mean.detach().to(at::kCPU, dtype_).contiguous();
  at::Tensor std = s.std.detach().to(at::kCPU, dtype_).contiguous();
  at::Tensor text = s.text.defined() ? s.text.detach().to(at::kCPU, at::kFloat).contiguous() : at::Tensor();
  VIDIT_CHECK(!s.cond.defined() || s.cond.sizes() == s.mean.sizes(), "cache writer: sample '", s.key,
              "': its condition latent ", s.cond.sizes(), " is not shaped as its latent ", s.mean.sizes());
  VIDIT_CHECK(!s.image.defined() || s.image.dim() == 2, "cache writer: sample '", s.key,
              "': its image features must be [tokens, D], got ", s.image.sizes());
  // The condition latent is stored as the latents are; CLIP features in bf16 as well (the DiT
  // projects them under autocast).
  at::Tensor cond = s.cond.defined() ? s.cond.detach().to(at::kCPU, dtype_).contiguous() : at::Tensor();
  at::Tensor image = s.image.defined() ? s.image.detach().to(at::kCPU, dtype_).contiguous() : at::Tensor();
  pending_[s.key + "/mean"] = mean;
  pending_[s.key + "/std"] = std;
  if (text.defined()) pending_[s.key + "/text"] = text;
  if (cond.defined()) pending_[s.key + "/cond"] = cond;
  if (image.defined()) pending_[s.key + "/image"] = image;
  CacheIndexEntry e;
  e.key = s.key, e.bucket = s.bucket, e.text_ref = s.text_ref, e.meta = s.meta;
  e.shape = mean.sizes().vec();
  e.checksum = checksum(mean, std, text, cond, image);
  e.cond = cond.defined();
  if (image.defined()) e.image_shape = image.sizes().vec();
  e.rev = s.rev;
  e.made = s.made;
  done_[s.key] = CachedKey{s.rev, "", s.text_ref, caption_digest(s.meta.value("caption", std::string())),
                           s.made.is_null() ? std::string() : s.made.dump(), s.meta.value("source", std::string())};
  pending_index_.push_back(std::move(e));
  pending_bytes_ += int64_t(2 * mean.numel() * mean.element_size() + (text.defined() ? text.numel() * 4 : 0));
  for (const at::Tensor* t : {&cond, &image})
    if (t->defined()) pending_bytes_ += int64_t(t->numel() * t->element_size());
  if (pending_bytes_ >= shard_bytes_) flush();
}

void CacheWriter::flush() {
  if (pending_index_.empty()) return;
  char name[32];
  std::snprintf(name, sizeof name, "w%03d-%05lld", worker_, static_cast<long long>(next_shard_));
  const std::string shard = std::string("shards/") + name + ".safetensors";
  save_safetensors(dir_ + "/" + shard, pending_, {{"format", "vidit-latent-cache-1"}});
  std::string lines;
  for (auto& e : pending_index_) {
    e.shard = shard;
    done_[e.key].shard = shard;
    lines += e.to_json().dump() + "\n";
  }
  write_file_atomic(dir_ + "/index/" + name + ".jsonl", lines);  // the commit point
  written_ += int64_t(pending_index_.size());
  ++next_shard_;
  pending_.clear();
  pending_index_.clear();
  pending_bytes_ = 0;
}

CacheIndexEntry CacheWriter::cached_entry(const std::string& key) const {
  auto it = done_.find(key);
  VIDIT_CHECK(it != done_.end() && !it->second.shard.empty(), "cache '", dir_, "': '", key, "' is not in a finished shard");
  // Shard shards/NAME.safetensors is committed by index/NAME.jsonl.
  const std::string name = fs::path(it->second.shard).stem().string();
  for (auto& e : read_index_file(dir_ + "/index/" + name + ".jsonl"))
    if (e.key == key && e.rev == it->second.rev) return e;
  fail("cache '", dir_, "': index/", name, ".jsonl has no line for '", key, "' (revision ", it->second.rev, ")");
}

int64_t merge_cache_index(const std::string& dir) {
  auto all = merged_parts(dir);
  std::string out;
  for (const auto& e : all) out += e.to_json().dump() + "\n";
  write_file_atomic(dir + "/index.jsonl", out);
  return int64_t(all.size());
}

// ---------------------------------------------------------------------------------------------
struct LatentCache::Shard {
  std::string path;
  std::unique_ptr<MappedFile> file;
  TensorMap tensors;  // views into the mapping
};

LatentCache::LatentCache(const std::string& dir) : dir_(dir) {
  VIDIT_CHECK(fs::is_directory(dir), "latent cache '", dir, "' does not exist; run `vidit prepare` first");
  entries_ = fs::exists(dir + "/index.jsonl") ? read_index_file(dir + "/index.jsonl") : merged_parts(dir);
  VIDIT_CHECK(!entries_.empty(), "latent cache '", dir, "' has no samples (empty index); run `vidit prepare`");
}

LatentCache::~LatentCache() = default;

std::shared_ptr<LatentCache::Shard> LatentCache::shard(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = shards_.find(name);
  if (it != shards_.end()) return it->second;
  auto s = std::make_shared<Shard>();
  s->path = dir_ + "/" + name;
  s->file = std::make_unique<MappedFile>(s->path, "cache shard", "re-run vidit prepare to rewrite it");
  s->tensors = view_safetensors(s->file->data(), s->file->size(), s->path);
  shards_[name] = s;
  return s;
}

LatentCache::Loaded LatentCache::load(int64_t i, bool verify) const {
  VIDIT_CHECK(i >= 0 && i < size(), "latent cache: sample ", i, " out of range (", size(), ")");
  const CacheIndexEntry& e = entries_[size_t(i)];
  auto s = shard(e.shard);
  auto get = [&](const char* what, bool required) -> at::Tensor {
    auto it = s->tensors.find(e.key + "/" + what);
    if (it == s->tensors.end()) {
      VIDIT_CHECK(!required, "cache shard '", s->path, "' has no '", e.key, "/", what, "' (index and shard disagree)");
      return {};
    }
    // The returned view owns a reference to the shard, so the mapping outlives every tensor.
    auto keep = new std::shared_ptr<Shard>(s);
    return at::from_blob(it->second.data_ptr(), it->second.sizes(), [keep](void*) { delete keep; },
                         it->second.options());
  };
  Loaded out{get("mean", true), get("std", true), e.text_ref.empty() ? get("text", true) : at::Tensor(),
             e.cond ? get("cond", true) : at::Tensor(), e.image_shape.empty() ? at::Tensor() : get("image", true)};
  VIDIT_CHECK(out.mean.sizes().vec() == e.shape, "cache sample '", e.key, "' in '", s->path, "' has shape ",
              out.mean.sizes(), " but the index says ", c10::IntArrayRef(e.shape));
  if (verify && checksum(out.mean, out.std, out.text, out.cond, out.image) != e.checksum)
    throw CacheCorruption("cache sample '" + e.key + "' in '" + s->path +
                          "' fails its checksum (the shard is damaged); it is skipped. "
                          "Re-run vidit prepare after deleting that shard and its index part to rebuild it");
  if (!e.text_ref.empty()) {
    const std::string ref = fs::path(e.text_ref).is_absolute() ? e.text_ref : dir_ + "/" + e.text_ref;
    out.text = read_text_embedding(ref);
  }
  return out;
}

std::vector<std::string> LatentCache::verify_all() const {
  std::vector<std::string> bad;
  for (int64_t i = 0; i < size(); ++i) {
    try {
      load(i, true);
    } catch (const Error& e) {
      bad.push_back(e.what());
    }
  }
  return bad;
}

}  // namespace vidit

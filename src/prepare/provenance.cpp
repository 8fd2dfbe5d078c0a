#include "prepare/provenance.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "diffusion/frame_condition.h"
#include "core/error.h"

namespace vidit {
namespace fs = std::filesystem;
namespace {

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

struct FileStat {
  int64_t size = -1, mtime_ns = 0;
};

FileStat stat_file(const std::string& path) {
  struct stat st {};
  VIDIT_CHECK(::stat(path.c_str(), &st) == 0, "'", path, "' cannot be read: ", std::strerror(errno));
  return {int64_t(st.st_size), int64_t(st.st_mtim.tv_sec) * 1000000000 + int64_t(st.st_mtim.tv_nsec)};
}

std::string absolute_normal(const std::string& path) { return fs::absolute(path).lexically_normal().string(); }

}  // namespace

std::string weights_identity(const std::string& path) {
  if (path.empty()) return "";
  VIDIT_CHECK(fs::exists(path), "'", path, "' does not exist");
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::recursive_directory_iterator(path))
      if (e.is_regular_file()) files.push_back(fs::relative(e.path(), path).string());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back("");
  }
  std::string listing;
  for (const auto& f : files) {
    const std::string full = f.empty() ? path : (fs::path(path) / f).string();
    const FileStat s = stat_file(full);
    listing += (f.empty() ? fs::path(path).filename().string() : f) + " " + std::to_string(s.size) + " " +
               std::to_string(s.mtime_ns) + "\n";
  }
  return hex(XXH3_64bits(listing.data(), listing.size()));
}

std::string file_range_hash(const std::string& path, int64_t offset, int64_t size) {
  std::ifstream in(path, std::ios::binary);
  VIDIT_CHECK(in, "'", path, "' cannot be read: ", std::strerror(errno));
  in.seekg(offset);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> st(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(st.get());
  std::vector<char> buf(4 << 20);
  int64_t left = size < 0 ? std::numeric_limits<int64_t>::max() : size;
  while (in && left > 0) {
    in.read(buf.data(), std::streamsize(std::min<int64_t>(left, int64_t(buf.size()))));
    XXH3_64bits_update(st.get(), buf.data(), size_t(in.gcount()));
    left -= in.gcount();
  }
  VIDIT_CHECK(size < 0 ? in.eof() : left == 0, "'", path, "' could not be read to its end");
  return hex(XXH3_64bits_digest(st.get()));
}

std::string file_content_hash(const std::string& path) { return file_range_hash(path, 0, -1); }

Provenance::Provenance(const Config& cfg) : cfg_(cfg) {
  const DataConfig& d = cfg.data;
  if (!d.manifest.empty()) {
    const fs::path m = fs::absolute(d.manifest).lexically_normal();
    root_ = (fs::is_directory(m) ? m : m.parent_path()).string();
    if (root_.empty() || root_.back() != '/') root_ += '/';
  }
  const auto& b = cfg.buckets;
  encode_ = {{"data.codec", name_of(d.codec)},
             {"data.fps", d.fps},
             {"data.cache_dtype", name_of(d.cache_dtype)},
             {"data.square_pixels", d.square_pixels},
             {"buckets.resolutions", b.resolutions},
             {"buckets.aspect_ratios", b.aspect_ratios},
             {"buckets.frames", b.frames},
             {"buckets.frame_stride", b.frame_stride},
             {"buckets.multiple", b.multiple},
             {"buckets.max_upscale", b.max_upscale}};
  if (d.codec == Codec::demo) encode_["demo.codec_block"] = cfg.demo.codec_block;
  else encode_["data.vae_weights"] = weights_identity(d.vae_weights);
  // Image-to-video: what the clips are conditioned on, and the CLIP encoder of their features
  // (recorded only then, so a text-to-video cache's record is what it always was).
  if (appends_condition(cfg.model)) {
    encode_["model.condition"] = name_of(cfg.model.condition);
    if (cfg.model.image_dim > 0) encode_["data.image_encoder"] = weights_identity(d.image_encoder);
  }
  text_encoder_ = text_encoder_identity(cfg);
}

std::string text_encoder_identity(const Config& cfg) {
  if (cfg.data.text_encoder == TextEncoder::precomputed) return "precomputed";
  if (!cfg.text.encoder.empty())
    return "umt5 " + weights_identity(cfg.text.encoder) + " tokenizer " + weights_identity(cfg.text.tokenizer) + " " +
           name_of(cfg.text.dtype) + " len " + std::to_string(cfg.model.text_len);
  return "demo " + std::to_string(cfg.model.text_len) + "x" + std::to_string(cfg.model.text_dim);
}

std::string Provenance::relative(const std::string& path) const {
  const std::string a = absolute_normal(path);
  return !root_.empty() && a.rfind(root_, 0) == 0 ? a.substr(root_.size()) : a;
}

nlohmann::json Provenance::source(const std::string& path) const {
  const FileStat s = stat_file(path);
  return {{"path", relative(path)}, {"size", s.size}, {"mtime_ns", s.mtime_ns}};
}

nlohmann::json Provenance::source(const ManifestEntry& e) const {
  if (!e.in_shard()) return source(e.path);
  const FileStat s = stat_file(e.shard);
  return {{"path", relative(e.path)}, {"size", e.member_size}, {"mtime_ns", s.mtime_ns}};
}

std::string Provenance::content_hash(const ManifestEntry& e) const {
  if (e.path != hashed_path_) {
    hashed_ = e.in_shard() ? file_range_hash(e.shard, e.member_offset, e.member_size) : file_content_hash(e.path);
    hashed_path_ = e.path;
  }
  return hashed_;
}

nlohmann::json Provenance::text(const ManifestEntry& e) const {
  nlohmann::json j{{"encoder", text_encoder_}};
  if (cfg_.data.text_encoder == TextEncoder::precomputed) {
    FileStat s;  // size -1 when it cannot be read (the clip's caption step names that)
    try {
      s = stat_file(e.text_embedding);
    } catch (const std::exception&) {
    }
    j["file"] = e.text_embedding, j["size"] = s.size, j["mtime_ns"] = s.mtime_ns;
  } else {
    j["caption"] = hex(XXH3_64bits(e.caption.data(), e.caption.size()));
  }
  return j;
}

nlohmann::json Provenance::made(const ManifestEntry& e, const nlohmann::json& source, double start, double end) const {
  nlohmann::json src = source;
  if (cfg_.data.source_identity == SourceIdentity::content) src["xxh64"] = content_hash(e);
  return {{"source", src}, {"window", {start, end}}, {"encode", encode_}, {"text", text(e)}};
}

std::vector<std::string> encode_differences(const nlohmann::json& was, const nlohmann::json& now) {
  std::vector<std::string> out;
  for (const auto& [key, value] : now.items()) {
    const auto w = was.find(key);
    if (w == was.end()) out.push_back(key + ": (not recorded) -> " + value.dump());
    else if (*w != value) out.push_back(key + ": " + w->dump() + " -> " + value.dump());
  }
  for (const auto& [key, value] : was.items())
    if (!now.contains(key)) out.push_back(key + ": " + value.dump() + " -> (not set)");
  return out;
}

ProvenanceChange Provenance::compare(const std::string& was_text, const ManifestEntry& e,
                                     const nlohmann::json& source) const {
  ProvenanceChange c;
  if (was_text.empty()) {
    c.recorded = false;
    return c;
  }
  const nlohmann::json was = nlohmann::json::parse(was_text);
  const nlohmann::json& s = was.at("source");
  const int64_t size = source.is_null() ? -1 : source.at("size").get<int64_t>();
  if (source.is_null()) {
    // The video is not there to compare: the clip is judged by the rest of its record.
  } else if (s.value("size", int64_t(-1)) != size) {
    c.source = "its size changed (" + std::to_string(s.value("size", int64_t(-1))) + " -> " + std::to_string(size) +
               " bytes)";
  } else if (s.value("mtime_ns", int64_t(0)) != source.at("mtime_ns").get<int64_t>()) {
    // A new time: the same video only when its bytes say so (when the record has their hash).
    if (!s.contains("xxh64"))
      c.source = "its modification time changed (with data.source_identity = \"content\" a copy with new times "
                 "is known by its bytes)";
    else if (s.at("xxh64").get<std::string>() != content_hash(e))
      c.source = "its bytes changed";
  }
  c.encode = encode_differences(was.value("encode", nlohmann::json::object()), encode_);
  const nlohmann::json t = was.value("text", nlohmann::json::object()), now = text(e);
  if (t.value("encoder", std::string()) != now.at("encoder").get<std::string>()) c.text = "text encoder changed";
  else if (t != now) c.text = now.contains("file") ? "text_embedding file changed" : "caption changed";
  return c;
}

}  // namespace vidit

// What made a cache entry, recorded in its index line ("made") by `vidit prepare` and compared
// with the inputs on every rerun and by `vidit prepare --verify`, so that the cache never serves
// what its inputs no longer say:
//   "source"  the video: its path relative to the manifest's root (the manifest's folder; the
//             absolute path for a video outside it), size, modification time, and with
//             data.source_identity = "content" an xxh64 of its bytes;
//   "window"  [start, end] seconds of the clip in the source (-1: open);
//   "encode"  every setting that shapes the latents, under its config key: data.codec, the VAE
//             weights' identity (data.vae_weights), data.fps, data.cache_dtype,
//             data.square_pixels, demo.codec_block, the [buckets] keys;
//   "text"    the caption's xxh64 (or the precomputed embedding file with its size and time) and
//             the text encoder's identity (the demo embedder's shape, or umT5's weights,
//             tokenizer, dtype and text_len).
// A change of source means the video was replaced: its clips are encoded again. A change of
// encode settings is data.on_change's to decide (stop naming them, or encode again). A change of
// text is embedded again without encoding the video. An entry without a record (a cache written
// before records were kept) is judged by what it recorded: its caption.
//
// Weights are known by the names, sizes and modification times of their files (hashed), not by
// reading gigabytes.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "prepare/manifest.h"

namespace vidit {

// xxh64 (hex) of the names, sizes and modification times of the file `path`, or of every file
// under the folder `path`; "" for "". Throws vidit::Error naming a path that is not there.
std::string weights_identity(const std::string& path);

// The text encoder's identity: "demo LENxDIM", "precomputed", or umT5's weights and tokenizer
// (weights_identity), dtype and text_len.
std::string text_encoder_identity(const Config& cfg);

// The parts of two records that differ.
struct ProvenanceChange {
  bool recorded = true;              // false: the cached entry has no record (judged by its caption)
  std::string source;                // why the source is another video ("" when it is the same)
  std::vector<std::string> encode;   // "data.fps: 16 -> 8", one per setting that differs
  std::string text;                  // "caption changed", "text_embedding file changed" or "text encoder changed"
  bool any() const { return !source.empty() || !encode.empty() || !text.empty(); }
};

class Provenance {
 public:
  // The encode settings and text encoder identity of this run's config; the manifest's root.
  explicit Provenance(const Config& cfg);

  const nlohmann::json& encode() const { return encode_; }
  const std::string& text_encoder() const { return text_encoder_; }
  // The source record of the video at `path`: its relative path, size and time (made() adds the
  // hash with "content"). Throws vidit::Error when the file cannot be read.
  nlohmann::json source(const std::string& path) const;
  // The same for entry `e`'s video: a WebDataset member is recorded by its path (<shard>/<member>,
  // relative), its own size and its shard's time.
  nlohmann::json source(const ManifestEntry& e) const;
  // The path recorded for the video at `path`: relative to the manifest's root when under it.
  std::string relative(const std::string& path) const;
  // The text record of entry `e`.
  nlohmann::json text(const ManifestEntry& e) const;
  // The whole record of a clip of `e` in [start, end], from its source record.
  nlohmann::json made(const ManifestEntry& e, const nlohmann::json& source, double start, double end) const;

  // How the record `was` (compact JSON, "" for none) differs from the current `source` (null:
  // the video is not there, and the source is not compared) and text of entry `e`, and this
  // run's encode settings. A source of the same size whose time changed
  // is read and compared by its bytes when the record has their hash.
  ProvenanceChange compare(const std::string& was, const ManifestEntry& e, const nlohmann::json& source) const;

 private:
  std::string content_hash(const ManifestEntry& e) const;  // of the last video asked, kept
  const Config& cfg_;
  mutable std::string hashed_path_, hashed_;
  std::string root_;  // the manifest's folder, absolute, with a trailing '/'
  nlohmann::json encode_;
  std::string text_encoder_;
};

// The settings that differ between two encode records, as "key: was -> now".
std::vector<std::string> encode_differences(const nlohmann::json& was, const nlohmann::json& now);

// xxh64 (hex) of a whole file's bytes.
std::string file_content_hash(const std::string& path);
// The same hash of the bytes [offset, offset + size) of the file at `path` (a tar member).
std::string file_range_hash(const std::string& path, int64_t offset, int64_t size);

}  // namespace vidit

// The latent cache: what `vidit prepare` writes once and training reads many times.
//
// Layout of a cache directory:
//   shards/w{W}-{N}.safetensors  tensors of many samples: "{key}/mean", "{key}/std" [C, T, H, W]
//                                (bf16 by default) and, unless the sample refers to a
//                                precomputed embedding file, "{key}/text" [Lt, D]
//   index/w{W}-{N}.jsonl         one JSON line per sample of that shard (written after the shard)
//   index.jsonl                  all index parts merged, sorted by key (merge_cache_index)
// W is the writer (a worker process of prepare), N its shard counter. Each index line holds the
// key, shard file, bucket name, latent shape, a 64-bit xxHash checksum of the sample's bytes,
// the text reference (if any), free-form metadata (source path, clip range, fps, caption) and
// the record of what made it ("made", prepare/provenance.h), which reruns compare with their inputs.
//
// Writes are atomic per shard: the shard file, then its index part, each through a temporary
// name, fsync and rename. A sample counts as done only when its index part exists, so a run
// killed mid-shard redoes that shard's samples on the next run and never reads a partial file.
//
// LatentCache reads the index and maps shard files with mmap: tensors are views into the page
// cache, copied only when a batch is assembled. load() verifies the checksum (cheap next to the
// copy) and throws CacheCorruption naming the key and shard on a mismatch.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"

namespace vidit {

struct CacheSample {
  std::string key;        // unique and stable (see cache_key)
  at::Tensor mean, std;   // [C, T, H, W] latent posterior (std = exp(logvar / 2))
  at::Tensor text;        // [Lt, D] text embedding; undefined when text_ref is set
  // Image-to-video (model.condition): the condition video's latent [C, T, H, W] (the clip's given
  // frames, zeros between, through the same encoder; "{key}/cond") and the first (and last)
  // frame's CLIP features [tokens, D] ("{key}/image"); undefined in a text-to-video cache.
  at::Tensor cond, image;
  std::string text_ref;   // a safetensors file holding this sample's text embedding, or empty
  std::string bucket;     // bucket name, e.g. "17x256x448"
  nlohmann::json meta = nlohmann::json::object();  // source, start, end, fps, caption, ...
  // Revision of the key: a later revision of a key replaces the earlier one (a re-captioned clip's
  // new text). 0 for a key's first sample.
  int64_t rev = 0;
  // What made it (prepare/provenance.h: source, window, encode settings, text), or null.
  nlohmann::json made;
};

struct CacheIndexEntry {
  std::string key, shard, bucket, text_ref;
  std::vector<int64_t> shape;  // latent [C, T, H, W]
  uint64_t checksum = 0;
  int64_t rev = 0;             // "rev" in the line, absent for 0 (caches written before it)
  nlohmann::json meta;
  nlohmann::json made;         // "made": what made it (prepare/provenance.h); null in caches written before it
  // Image-to-video: "cond" true when the shard holds "{key}/cond" (the condition latent, shaped as
  // the latent), "image" the shape [tokens, D] of "{key}/image" (empty: none).
  bool cond = false;
  std::vector<int64_t> image_shape;
  nlohmann::json to_json() const;
  static CacheIndexEntry from_json(const nlohmann::json& j, const std::string& where);
};

// Reads a precomputed text embedding file: a safetensors file holding one tensor, or one named
// "text". Returned as fp32. Throws vidit::Error naming the file otherwise.
at::Tensor read_text_embedding(const std::string& path);

// A stable key for a clip: 16 hex digits of xxHash64 over (path, start, end).
std::string cache_key(const std::string& path, double start_seconds, double end_seconds);

// Thrown by LatentCache::load when a sample's bytes do not match its checksum.
class CacheCorruption : public Error {
 public:
  using Error::Error;
};

// What a rerun of prepare needs to know of a key already cached: its latest revision, where it
// is, and what it was made from (the caption's hash, or the precomputed embedding file; and the
// whole record of what made it, compact JSON, empty in caches written before it was recorded).
struct CachedKey {
  int64_t rev = 0;
  std::string shard, text_ref;
  uint64_t caption_digest = 0;
  std::string made;
  std::string source;  // meta's "source": the path the video was read from
};
uint64_t caption_digest(const std::string& caption);

// The sample of `e` (an index entry of the cache in `dir`) read from its shard and checked
// against its checksum (CacheCorruption on a mismatch); its tensors are copies.
CacheSample read_cached_sample(const std::string& dir, const CacheIndexEntry& e);

class CacheWriter {
 public:
  // `worker`: this process's slice number (keeps shard names disjoint); `shard_bytes`: a shard
  // is written once its samples reach this size; `dtype`: storage type of mean / std.
  CacheWriter(std::string dir, int worker, int64_t shard_bytes, at::ScalarType dtype = at::kBFloat16);
  ~CacheWriter();  // writes what is pending (errors are printed, not thrown)

  // Keys already in finished shards of any worker (their latest revision): a rerun skips them,
  // or replaces one with a later revision.
  const std::map<std::string, CachedKey>& done() const { return done_; }
  // The whole index entry of a cached key (read from its index part); throws if it is not cached.
  CacheIndexEntry cached_entry(const std::string& key) const;
  // Adds a sample; one of a key already cached at the same or a later revision is dropped.
  void add(const CacheSample& s);
  void flush();  // writes the pending shard and its index part now
  int64_t samples_written() const { return written_; }

 private:
  std::string dir_;
  int worker_;
  int64_t shard_bytes_;
  at::ScalarType dtype_;
  std::map<std::string, CachedKey> done_;
  std::map<std::string, at::Tensor> pending_;
  std::vector<CacheIndexEntry> pending_index_;
  int64_t pending_bytes_ = 0, next_shard_ = 0, written_ = 0;
};

// Merges index/*.jsonl into index.jsonl (sorted by key, atomically; of a key's revisions the
// latest). Returns the sample count. Throws naming the part and line for a malformed line, or a
// key written twice at the same revision.
int64_t merge_cache_index(const std::string& dir);

class LatentCache {
 public:
  // Reads dir/index.jsonl, or merges the parts in memory when it is missing.
  explicit LatentCache(const std::string& dir);
  ~LatentCache();

  int64_t size() const { return int64_t(entries_.size()); }
  const CacheIndexEntry& entry(int64_t i) const { return entries_[size_t(i)]; }
  const std::string& dir() const { return dir_; }

  struct Loaded {
    at::Tensor mean, std, text;  // views into the mapped shard (text may be loaded from text_ref)
    at::Tensor cond, image;      // image-to-video's (CacheSample), or undefined
  };
  // Thread-safe. Throws CacheCorruption on a checksum mismatch (when `verify`), vidit::Error when
  // the shard or text file is missing or malformed.
  Loaded load(int64_t i, bool verify = true) const;
  // Checks every sample; returns one message per failure (empty: all good).
  std::vector<std::string> verify_all() const;

 private:
  struct Shard;
  std::shared_ptr<Shard> shard(const std::string& name) const;
  std::string dir_;
  std::vector<CacheIndexEntry> entries_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::shared_ptr<Shard>> shards_;
};

}  // namespace vidit

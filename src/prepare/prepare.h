// `vidit prepare`: manifest -> decode -> bucket -> latents -> the latent cache, once.
//
// Each entry of the manifest is decoded (clip window, frame rate, device from [data]), assigned
// a bucket ([buckets]), resized and centre-cropped, encoded by the frame encoder (the VAE or the
// demo codec) into latent mean and std, paired with its text embedding (a caption encoder, or
// the precomputed file the manifest names), and written to the cache (latent_cache.h).
//
// Nothing stops the run but a broken cache directory: every input that cannot be used (missing
// or unreadable file, no video stream, unsupported codec, too short or too small for every
// bucket, a bad text embedding, a bad manifest line) is appended to rejects/w{W}.jsonl with its
// reason and a short category (missing, decode, bucket, caption, encode, write, manifest) at
// once, and the next entry goes on. Reruns skip what is in finished shards.
//
// Progress (core/progress.h), when asked for: videos done / this worker's total, clips written,
// already cached, rejects by category, rate and time left. Each worker also rewrites
// progress/w{W}.json every few seconds, and worker 0 of several adds the totals of all of them.
//
// Parallel: worker W of N takes the entries with index % N == W. Each worker marks itself done;
// the last to finish merges the index parts into index.jsonl and the rejects into rejects.jsonl.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>

#include "core/config.h"
#include "core/progress.h"

namespace vidit {

// RGB frames [T, H, W, 3] uint8 -> (mean, std), each [C, T', H', W'].
using FrameEncoder = std::function<std::pair<at::Tensor, at::Tensor>(const at::Tensor& frames)>;
// caption -> [Lt, D] text embedding.
using CaptionEncoder = std::function<at::Tensor(const std::string& caption)>;

struct PrepareReport {
  int64_t entries = 0;         // manifest entries in this worker's slice
  int64_t written = 0;         // samples added to the cache by this run
  int64_t already_done = 0;    // found in finished shards and skipped
  int64_t rejected = 0;        // manifest lines and clips that could not be used
  bool merged = false;         // this worker merged the indexes (it finished last)
  double seconds = 0;
  double source_seconds = 0;   // duration of the video that went into the cache
  std::map<std::string, int64_t> per_bucket;   // samples written per bucket name
  std::map<std::string, int64_t> rejected_by;  // rejects per category (they sum to `rejected`)
};

// `captions` may be empty when data.text_encoder = "precomputed". `progress`: where and how to
// show progress (its label, unit and total are set here); nullptr shows none.
PrepareReport prepare_cache(const Config& cfg, const FrameEncoder& encode, const CaptionEncoder& captions,
                            int worker = 0, int workers = 1, const Progress::Options* progress = nullptr);

// The reports of workers 0..workers-1 that finished (done/w{W}), summed; seconds is the longest.
// Throws vidit::Error naming a report that cannot be read.
PrepareReport prepare_totals(const std::string& cache_dir, int workers);

// A table for the end of a run: clips per bucket, rejects per category, entries, time, rate.
std::string prepare_summary(const PrepareReport& r, const std::string& title);

// Re-merges index parts and rejects (after workers finished without the last one merging).
int64_t merge_prepared(const std::string& cache_dir);

}  // namespace vidit

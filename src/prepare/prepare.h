// `vidit prepare`: manifest -> decode -> bucket -> latents -> the latent cache, once.
//
// Each entry of the manifest is decoded (clip window, frame rate, device from [data]), assigned
// a bucket ([buckets]), resized and centre-cropped, encoded by the frame encoder (the VAE or the
// demo codec) into latent mean and std, paired with its text embedding (a caption encoder, or
// the precomputed file the manifest names), and written to the cache (latent_cache.h).
//
// Many clips per video (data.clip_seconds > 0, optionally data.split_scenes): each entry is
// decoded once, as a stream (decode_video_streaming), and cut into windows of clip_seconds
// (clips.h) that cross no scene cut (scene_cuts.h); each window is bucketed, encoded and cached
// under its own key, cache_key(path, window start, window end), with the source and the window
// in the index's meta, as soon as the decode has passed its end, so memory holds about one clip of
// frames whatever the video's length. A video whose clips are all in finished shards is skipped
// without decoding on a rerun: clips/w{W}.jsonl records each finished video's clip keys (under a
// key of its path, manifest window and the clip settings); a video with some clips missing is
// decoded again and only the missing clips are encoded. A clip that fits no bucket is a reject
// naming the video and the window; a video that gives no clip at all (every scene shorter than
// clip_seconds) is a reject of category "clips"; a video whose scene detector gave up (a cut on
// nearly every frame: strobe, flicker) is a counted warning, and the rest of it is one scene.
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
#include "loader/latent_cache.h"
#include "core/progress.h"

namespace vidit {

// The clip a frame encoder is given: its cache key and source video (for its messages, and for
// the fault injection that wraps an encoder, frame_encoder.h).
struct ClipRef {
  std::string key;
  std::string source;
};
// RGB frames [T, H, W, 3] uint8 of `clip` -> (mean, std), each [C, T', H', W'].
using FrameEncoder = std::function<std::pair<at::Tensor, at::Tensor>(const at::Tensor& frames, const ClipRef& clip)>;
// Image-to-video (model.condition): the frames of `clip` as encoded (fit to its bucket) -> the
// condition video's latent [C, T', H', W'] (its given frames, zeros between, through the frame
// encoder) and, where the model attends to them, the given frames' CLIP features [tokens, D].
struct ClipCondition {
  at::Tensor latent, image;
};
using ConditionEncoder = std::function<ClipCondition(const at::Tensor& frames, const ClipRef& clip)>;
// caption -> [Lt, D] text embedding.
using CaptionEncoder = std::function<at::Tensor(const std::string& caption)>;

struct PrepareReport {
  int64_t entries = 0;         // manifest entries in this worker's slice
  int64_t written = 0;         // samples added to the cache by this run
  int64_t already_done = 0;    // found in finished shards and skipped
  int64_t reembedded = 0;      // found with another caption or text encoder: new text, latents copied (a new revision)
  int64_t reencoded = 0;       // found made from another video at its path, or with other settings
                               // (data.on_change = "reencode"): encoded again (a new revision)
  int64_t rejected = 0;        // manifest lines and clips that could not be used
  bool merged = false;         // this worker merged the indexes (it finished last)
  double seconds = 0;
  double source_seconds = 0;   // duration of the video that went into the cache
  std::map<std::string, int64_t> per_bucket;   // samples written per bucket name
  std::map<std::string, int64_t> rejected_by;  // rejects per category (they sum to `rejected`)
  // Cutting clips (data.clip_seconds > 0): videos that gave at least one clip (written or already
  // cached), and warnings per kind ("scenes": the cut detector gave up on a video).
  int64_t videos_cut = 0;
  std::map<std::string, int64_t> warned_by;
};

// `captions` may be empty when data.text_encoder = "precomputed". `progress`: where and how to
// show progress (its label, unit and total are set here); nullptr shows none.
// `condition`: image-to-video's, or empty for text-to-video (make_condition_encoder gives it).
PrepareReport prepare_cache(const Config& cfg, const FrameEncoder& encode, const CaptionEncoder& captions,
                            int worker = 0, int workers = 1, const Progress::Options* progress = nullptr,
                            const ConditionEncoder& condition = {});

// The reports of workers 0..workers-1 that finished (done/w{W}), summed; seconds is the longest.
// Throws vidit::Error naming a report that cannot be read.
PrepareReport prepare_totals(const std::string& cache_dir, int workers);

// A table for the end of a run: clips per bucket, rejects per category, entries, time, rate.
std::string prepare_summary(const PrepareReport& r, const std::string& title);

// Re-merges index parts and rejects (after workers finished without the last one merging).
int64_t merge_prepared(const std::string& cache_dir);

// `vidit prepare --verify`'s check of the inputs: one line per cached sample that its inputs no
// longer match, "<key> <source> [start, end]: ...": its video replaced, its encode settings not
// this config's, its caption, embedding file or text encoder changed (provenance.h). A sample is
// found by its key, by its recorded path under the manifest's root and window (a data set that
// moved), or, for a clip cut from a video, by its source when the manifest has that video once.
// Samples of videos no longer in the manifest are counted in `*missing`; samples that recorded
// nothing of how they were made (written before records were kept, judged by their caption
// alone) in `*unrecorded`.
struct StaleReport {
  std::vector<std::string> stale;
  int64_t missing = 0, unrecorded = 0;
};
StaleReport stale_entries(const Config& cfg, const std::vector<CacheIndexEntry>& entries);

}  // namespace vidit

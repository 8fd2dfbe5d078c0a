// The demo's data, through the same path as a user's: make_demo_videos() renders clips of the
// training (colour, direction) pairs in three frame sizes (square, 5:4, 3:2) and lengths,
// encodes each to H.264 MP4 with FFmpeg and lists them in a captions.jsonl manifest.
// prepare_demo_data() runs `vidit prepare`'s code on that manifest (FFmpeg decode, [buckets]
// assignment with resize and centre crop, the lossless demo codec, the built-in caption
// embedder, the sharded latent cache; unusable files go to rejects.jsonl) and opens the
// bucketed, token-budgeted cache loader over the result.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "loader/cache_loader.h"
#include "prepare/prepare.h"

namespace vidit::demo {

struct VideoEntry {
  std::string path, caption;
};

// Writes <dir>/clip_NNNN.mp4 and <dir>/captions.jsonl; returns the entries.
std::vector<VideoEntry> make_demo_videos(const Config& cfg, const std::string& dir);

struct DemoData {
  std::vector<VideoEntry> videos;
  PrepareReport report;              // samples per bucket, rejects
  std::string cache_dir;
  std::shared_ptr<CacheLoader> loader;
};
// Videos in <out_dir>/videos, cache in <out_dir>/cache (rebuilt). Needs data.codec = "demo",
// data.text_encoder = "demo" and a demo.frames x demo.frame_size^2 bucket. The loader reads the
// part of each global batch that data-parallel rank `rank` of `world` trains on.
DemoData prepare_demo_data(const Config& cfg, const std::string& out_dir, int rank = 0, int world = 1);

}  // namespace vidit::demo

// The demo's data set on disk and in memory. make_demo_videos() renders clips of the training
// (colour, direction) pairs in a few frame sizes and lengths, encodes each to H.264 MP4 with
// FFmpeg and lists them in captions.jsonl. load_demo_dataset() decodes those files with the
// FFmpeg decoder, centre-crops to the training size, keeps the first frames, encodes them with
// the demo codec and embeds the captions. A file that cannot be decoded is skipped and reported.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/dataset.h"

namespace vidit::demo {

struct VideoEntry {
  std::string path, caption;
};

// Writes <dir>/clip_NNNN.mp4 and <dir>/captions.jsonl; returns the entries.
std::vector<VideoEntry> make_demo_videos(const Config& cfg, const std::string& dir);

struct LoadedDemo {
  std::shared_ptr<TensorDataset> dataset;
  std::vector<std::string> skipped;  // "path: reason"
};
LoadedDemo load_demo_dataset(const Config& cfg, const std::vector<VideoEntry>& entries);

// Centre crop of frames [T, H, W, 3] to size x size, first `frames` frames.
at::Tensor centre_crop(const at::Tensor& frames, int64_t size, int64_t frames_kept);

}  // namespace vidit::demo

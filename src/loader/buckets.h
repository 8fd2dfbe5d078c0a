// Buckets: the fixed set of (frames, height, width) shapes that training batches come in.
//
// A bucket spec crosses resolution tiers (the side of a square of the same area: 256 means
// about 256*256 pixels), aspect ratios (width / height) and frame counts. Every bucket's height
// and width are multiples of `multiple` (VAE stride x patch, 16 for Wan), so latents patchify
// evenly; frame counts must be 1 mod `frame_stride` (4k+1 for the causal Wan VAE).
//
// A clip goes to a bucket of its nearest nominal aspect ratio (in log space) with the most pixels x
// frames that it fills without being upscaled by more than `max_upscale` and without running
// out of frames. It is then resized (antialiased bilinear, aspect ratio kept) until it covers the
// bucket and centre-cropped. A clip that fits no bucket gets the reason, never an exception.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "core/config.h"

namespace vidit {

struct Bucket {
  int64_t frames = 0, height = 0, width = 0;
  double aspect = 0;         // the nominal width / height of its spec entry (before snapping)
  std::string name() const;  // "FxHxW", e.g. "49x480x832"
  bool operator==(const Bucket&) const = default;
};

// The bucket part of the config ([buckets] in TOML; fields documented in core/config.h).
using BucketSpec = BucketConfig;

// Every distinct bucket of the spec, sorted by (height, width, frames). Throws vidit::Error
// naming the field for an empty list, a non-positive entry, or a frame count that is not
// 1 mod frame_stride.
std::vector<Bucket> make_buckets(const BucketSpec& spec);

struct BucketChoice {
  int index = -1;       // into the bucket list; -1: rejected
  double scale = 0;     // resize factor applied before the centre crop
  std::string reason;   // why the clip was rejected (empty when accepted)
  bool ok() const { return index >= 0; }
};

// Chooses the bucket for a clip of `frames` frames of width x height (square pixels).
BucketChoice assign_bucket(const std::vector<Bucket>& buckets, int64_t width, int64_t height,
                           int64_t frames, double max_upscale);

// Resizes frames [T, H, W, 3] uint8 (T >= bucket.frames; the first bucket.frames are used) by
// `scale` (antialiased bilinear; at least covering the bucket) and centre-crops them to
// [bucket.frames, bucket.height, bucket.width, 3] uint8.
at::Tensor fit_to_bucket(const at::Tensor& frames, const Bucket& bucket);

}  // namespace vidit

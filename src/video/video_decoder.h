// Video files <-> uint8 RGB tensors.
//
// decode_video reads a clip from a container file (MP4, MKV, WebM, AVI, ...) with FFmpeg's
// libavformat/libavcodec (software, or NVDEC through the cuda hwaccel: DecodeOptions::device) and
// converts every output frame to packed RGB24 with libswscale, using the colour matrix and range
// the stream declares (BT.601 limited range when untagged, the same choice as the ffmpeg CLI, so
// software results match `ffmpeg -i F -f rawvideo -pix_fmt rgb24 -` byte for byte). Frames come
// out in presentation order, rotated to display orientation when the container carries a display
// matrix (multiples of 90 degrees; mirroring is ignored). If the resolution changes mid-stream,
// later frames are rescaled to the first frame's size. Pixel aspect ratio is reported, and applied
// only on request (DecodeOptions::square_pixels).
//
// Clips (DecodeOptions): a time window [start, end) reached by seeking to the key frame before the
// start and decoding forward, frame-exact (the frames equal `ffmpeg -ss START -i F`'s); an optional
// output frame rate (sample and hold, decode_frame_picker.h: the CLI's `fps=F:round=up`); a frame
// limit. Timestamps decide everything, so variable-frame-rate files work.
//
// Failure behaviour: every problem a user can fix throws vidit::Error whose message names the
// file and says what is wrong (missing file, not a media file, no video stream, no decoder for
// the codec, no decodable frame, no frame in the requested window, NVDEC requested but not
// available). Damage inside a stream is handled the way the ffmpeg CLI handles it: corrupt
// packets are skipped (the decoder conceals what it can) and a file cut off mid-stream yields the
// frames before the cut; only a stream from which no frame at all decodes is an error. FFmpeg's
// own log is lowered to errors-only on first use (unless the application already changed its
// level). Builds without FFmpeg (video_decoder_stub.cpp) throw from decode_video and report false
// from video_decoding_available().
//
// Thread safety: decode_video may run concurrently on any number of threads (each call owns its
// FFmpeg contexts; the NVDEC device is shared under a lock).
//
// encode_video_mp4 (video_encoder.cpp) writes with the same FFmpeg libraries (libswscale,
// libavcodec's libx264 encoder, libavformat's mp4 muxer); no `ffmpeg` program is run. It writes
// 4:4:4 H.264 tagged BT.709 limited range, which decode_video reads back within a few levels.
// Builds without FFmpeg throw from it as from decode_video.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "video/decode_options.h"

namespace vidit {

struct DecodedVideo {
  at::Tensor frames;      // [T, H, W, 3] uint8 RGB, contiguous, display orientation, T >= 1
  double fps = 0;         // target_fps when resampling; else the stream's average frame rate
                          // (0 when the file does not say)
  int64_t width = 0;      // W of `frames`
  int64_t height = 0;     // H of `frames`
  // Pixel aspect ratio of `frames` as returned (width : height of one pixel, reduced): the
  // stream's sample aspect ratio, inverted by a quarter-turn rotation; 1:1 for square pixels,
  // for streams that do not say, and after square_pixels stretching.
  int64_t sar_num = 1;
  int64_t sar_den = 1;
  // Presentation time of each frame in seconds from the start of the file (the time `-ss`
  // counts from); with target_fps, the output grid's times. Size T.
  std::vector<double> timestamps;
  // Pictures the decoder produced for this call, including those before the clip start that
  // seeking cannot skip (back to the key frame) and those resampling drops: the decode cost.
  int64_t frames_decoded = 0;
};

// False in builds without FFmpeg, where decode_video always throws.
bool video_decoding_available();

// Decodes the clip `options` describe from `path` (see DecodeOptions). Returns T >= 1 frames.
// Throws vidit::Error naming the file for: missing file, no video stream, unsupported codec,
// corrupt data that yields no frame, no frame inside the window, bad options, device=nvdec where
// NVDEC is unavailable or refuses the stream.
DecodedVideo decode_video(const std::string& path, const DecodeOptions& options);

// One output frame of decode_video_streaming: [H, W, 3] uint8 RGB in display orientation, valid
// only during the call (clone it to keep it), and its time in seconds (as DecodedVideo::timestamps).
// Return false to stop decoding.
using FrameSink = std::function<bool(const at::Tensor& frame, double seconds)>;

// decode_video that hands each output frame to `sink` as soon as it is ready instead of keeping
// them all, so that a long video costs the memory of one frame (plus what the sink keeps): the
// same frames, in order, with the same options and errors. The result has `frames` undefined and
// everything else filled in (timestamps of the frames delivered). With device=auto, a stream that
// NVDEC starts and cannot finish is decoded again in software, and the frames already delivered
// are not delivered twice. Exceptions from `sink` propagate.
DecodedVideo decode_video_streaming(const std::string& path, const DecodeOptions& options, const FrameSink& sink);

// The video stream's length in seconds from the start of the file, as its container says (the
// stream's duration, else the file's), or 0 when it does not say. Opens the file but decodes
// nothing beyond what probing needs. Throws vidit::Error naming the file as decode_video does.
// With byte_size >= 0, the video is the bytes [byte_offset, byte_offset + byte_size) of `path`
// (DecodeOptions::byte_offset).
double probe_video_seconds(const std::string& path, int64_t byte_offset = 0, int64_t byte_size = -1);

// The first max_frames (-1: all; otherwise > 0) frames in software with `threads` decoder threads
// (0 = one per core): decode_video(path, {.max_frames, .threads, .device = kCpu}).
DecodedVideo decode_video(const std::string& path, int64_t max_frames = -1, int threads = 0);

// Encodes frames [T, H, W, 3] uint8 RGB (any device; T, H, W >= 1) to an H.264 MP4 at `fps`
// (> 0) with FFmpeg's libraries: libx264 preset medium at constant quality `crf` in [0, 51]
// (0 = lossless), pixel format yuv444p tagged BT.709 (matrix, primaries, transfer) limited range,
// index at the front of the file (faststart). Optionally upscaled by an integer factor in
// [1, 64] with nearest-neighbour scaling (for viewing tiny generated clips). The parent
// directory of `path` must exist; an existing file is replaced. The file is written under a
// temporary name in the same directory and renamed to `path` when complete, so `path` never
// holds a partial video; on failure the temporary file is removed and the old file, if any, is
// untouched. Throws vidit::Error naming `path` for bad arguments, a missing or unwritable
// directory, a libavcodec without the libx264 encoder, any FFmpeg failure, and in builds
// without FFmpeg. Thread safe: each call owns its FFmpeg contexts.
void encode_video_mp4(const std::string& path, const at::Tensor& frames, double fps, int crf = 12,
                      int upscale = 1);

}  // namespace vidit

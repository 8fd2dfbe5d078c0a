// Video files <-> uint8 RGB tensors.
//
// decode_video reads a clip from a container file (MP4, MKV, WebM, AVI, ...) with FFmpeg's
// libavformat/libavcodec in software and converts every frame to packed RGB24 with libswscale,
// using the colour matrix and range the stream declares (BT.601 limited range when untagged,
// the same choice as the ffmpeg CLI, so results match `ffmpeg -i F -f rawvideo -pix_fmt rgb24 -`
// byte for byte). Frames come out in presentation order, rotated to display orientation when
// the container carries a display matrix (multiples of 90 degrees; mirroring is ignored). If the
// resolution changes mid-stream, later frames are rescaled to the first frame's size. Pixel
// aspect ratio is not applied: one output pixel is one coded pixel.
//
// Failure behaviour: every problem a user can fix throws vidit::Error whose message names the
// file and says what is wrong (missing file, not a media file, no video stream, no decoder for
// the codec, no decodable frame). Damage inside a stream is handled the way the ffmpeg CLI
// handles it: corrupt packets are skipped (the decoder conceals what it can) and a file cut off
// mid-stream yields the frames before the cut; only a stream from which no frame at all decodes
// is an error. FFmpeg's own log is lowered to errors-only on first use (unless the application
// already changed its level). Builds without FFmpeg (video_decoder_stub.cpp) throw from
// decode_video and report false from video_decoding_available().
//
// encode_video_mp4 needs no FFmpeg libraries: it pipes raw frames to the `ffmpeg` program
// (which must be on PATH, built with libx264) and is available in every build. It writes
// 4:4:4 H.264 tagged BT.709 limited range, which decode_video reads back within a few levels.
#pragma once
#include <ATen/ATen.h>

#include <string>

namespace vidit {

struct DecodedVideo {
  at::Tensor frames;      // [T, H, W, 3] uint8 RGB, contiguous, display orientation, T >= 1
  double fps = 0;         // average frame rate of the stream; 0 when the file does not say
  int64_t width = 0;      // W of `frames`
  int64_t height = 0;     // H of `frames`
};

// False in builds without FFmpeg, where decode_video always throws.
bool video_decoding_available();

// Decodes up to max_frames (-1: all; otherwise > 0) frames from the start of `path` with
// libavformat/libavcodec (software decode, multi-threaded: thread_count = threads, 0 = auto),
// converting to RGB24 with libswscale.
// Throws vidit::Error naming the file for: missing file, no video stream, unsupported codec,
// corrupt data that yields no frame, bad arguments.
DecodedVideo decode_video(const std::string& path, int64_t max_frames = -1, int threads = 0);

// Encodes frames [T, H, W, 3] uint8 RGB (any device; T, H, W >= 1) to an H.264 MP4 at `fps`
// (> 0) by piping raw frames to the `ffmpeg` CLI (libx264, pixel format yuv444p, -crf crf in
// [0, 51], -y: an existing file is overwritten), optionally upscaled by an integer factor
// (>= 1) with nearest-neighbour scaling (for viewing tiny generated clips). The parent
// directory of `path` must exist. Throws vidit::Error with ffmpeg's stderr tail if ffmpeg is
// missing or fails.
void encode_video_mp4(const std::string& path, const at::Tensor& frames, double fps, int crf = 12,
                      int upscale = 1);

}  // namespace vidit

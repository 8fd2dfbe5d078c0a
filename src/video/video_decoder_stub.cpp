// decode_video for builds without the FFmpeg development libraries (CMake compiles this file
// instead of video_decoder.cpp). encode_video_mp4 (video_encoder.cpp) still works: it only needs
// the ffmpeg program.
#include "core/error.h"
#include "video/video_decoder.h"

namespace vidit {

bool video_decoding_available() { return false; }

DecodedVideo decode_video(const std::string& path, const DecodeOptions& /*options*/) {
  fail("cannot decode video file '", path,
       "': this vidit build has no FFmpeg support (the FFmpeg development libraries were not "
       "found at configure time). Install them (Debian/Ubuntu: apt-get install libavformat-dev "
       "libavcodec-dev libavutil-dev libswscale-dev pkg-config) and reconfigure the build "
       "(rerun cmake, optionally with -DVIDIT_FFMPEG=ON to make their absence an error)");
}

DecodedVideo decode_video_streaming(const std::string& path, const DecodeOptions& options, const FrameSink&) {
  return decode_video(path, options);
}

double probe_video_seconds(const std::string& path) {
  decode_video(path, DecodeOptions{});  // throws: no FFmpeg in this build
  return 0;
}

DecodedVideo decode_video(const std::string& path, int64_t /*max_frames*/, int /*threads*/) {
  return decode_video(path, DecodeOptions{});
}

}  // namespace vidit

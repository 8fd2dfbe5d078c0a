// decode_video and encode_video_mp4 for builds without the FFmpeg development libraries (CMake
// compiles this file instead of video_decoder.cpp and video_encoder.cpp): every call throws a
// vidit::Error that names the file and the packages to install.
#include <filesystem>
#include <system_error>

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

double probe_video_seconds(const std::string& path, int64_t, int64_t) {
  decode_video(path, DecodeOptions{});  // throws: no FFmpeg in this build
  return 0;
}

DecodedVideo decode_video(const std::string& path, int64_t /*max_frames*/, int /*threads*/) {
  return decode_video(path, DecodeOptions{});
}

void encode_video_mp4(const std::string& path, const at::Tensor& /*frames*/, double /*fps*/,
                      int /*crf*/, int /*upscale*/) {
  // A missing output folder is reported as the FFmpeg build reports it: fixing it is needed too.
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  VIDIT_CHECK(parent.empty() || std::filesystem::is_directory(parent, ec), "encode_video_mp4('",
              path, "'): the output directory '", parent.string(),
              "' does not exist; create it first");
  fail("cannot write video file '", path,
       "': this vidit build has no FFmpeg support (the FFmpeg development libraries were not "
       "found at configure time). Install them (Debian/Ubuntu: apt-get install libavformat-dev "
       "libavcodec-dev libavutil-dev libswscale-dev pkg-config; Debian's libavcodec includes the "
       "libx264 encoder) and reconfigure the build (rerun cmake, optionally with -DVIDIT_FFMPEG=ON "
       "to make their absence an error)");
}

}  // namespace vidit

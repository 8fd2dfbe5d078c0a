// decode_video with FFmpeg (libavformat demux, libavcodec software decode, libswscale to RGB24).
// Compiled only when CMake finds the FFmpeg development libraries; video_decoder_stub.cpp
// replaces this file otherwise. encode_video_mp4 lives in video_encoder.cpp (every build).
#include "data/video_decoder.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <sstream>
#include <system_error>

#include "core/error.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/avutil.h>
#include <libavutil/display.h>
#include <libavutil/frame.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

namespace vidit {

namespace {

// av_err2str is a C compound-literal macro; this is its C++ equivalent.
std::string av_error_text(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  if (av_strerror(err, buf, sizeof(buf)) < 0) std::snprintf(buf, sizeof(buf), "FFmpeg error %d", err);
  return buf;
}

struct FormatCloser {
  void operator()(AVFormatContext* c) const { avformat_close_input(&c); }
};
struct CodecCloser {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct PacketFreer {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct FrameFreer {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct SwsFreer {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};
using FormatPtr = std::unique_ptr<AVFormatContext, FormatCloser>;
using CodecPtr = std::unique_ptr<AVCodecContext, CodecCloser>;
using PacketPtr = std::unique_ptr<AVPacket, PacketFreer>;
using FramePtr = std::unique_ptr<AVFrame, FrameFreer>;
using SwsPtr = std::unique_ptr<SwsContext, SwsFreer>;

// Library log output at INFO/WARNING level (deprecated-format notices, per-packet concealment
// chatter) drowns training logs; errors still print. A level the application set is kept.
void quiet_ffmpeg_logs() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (av_log_get_level() == AV_LOG_INFO) av_log_set_level(AV_LOG_ERROR);
  });
}

bool is_jpeg_range_format(int fmt) {
  switch (fmt) {
    case AV_PIX_FMT_YUVJ420P:
    case AV_PIX_FMT_YUVJ422P:
    case AV_PIX_FMT_YUVJ444P:
    case AV_PIX_FMT_YUVJ440P:
    case AV_PIX_FMT_YUVJ411P:
      return true;
    default:
      return false;
  }
}

bool is_yuv_format(int fmt) {
  const AVPixFmtDescriptor* d = av_pix_fmt_desc_get(static_cast<AVPixelFormat>(fmt));
  return d && !(d->flags & AV_PIX_FMT_FLAG_RGB) && d->nb_components >= 3;
}

// "1 audio (aac), 1 subtitle (mov_text)"-style summary for the no-video-stream message.
std::string describe_streams(const AVFormatContext* fmt) {
  if (fmt->nb_streams == 0) return "no streams at all";
  std::ostringstream os;
  for (unsigned i = 0; i < fmt->nb_streams; ++i) {
    const AVStream* st = fmt->streams[i];
    const char* type = av_get_media_type_string(st->codecpar->codec_type);
    os << (i ? ", " : "") << "#" << i << " " << (type ? type : "unknown") << " ("
       << avcodec_get_name(st->codecpar->codec_id)
       << ((st->disposition & AV_DISPOSITION_ATTACHED_PIC) ? ", cover art" : "") << ")";
  }
  return os.str();
}

// The stream's display matrix, if any (9 x int32, see libavutil/display.h).
const int32_t* display_matrix(const AVStream* st) {
#if LIBAVCODEC_VERSION_INT >= AV_VERSION_INT(60, 29, 100)
  const AVPacketSideData* sd = av_packet_side_data_get(
      st->codecpar->coded_side_data, st->codecpar->nb_coded_side_data, AV_PKT_DATA_DISPLAYMATRIX);
  if (sd && sd->size >= 9 * sizeof(int32_t)) return reinterpret_cast<const int32_t*>(sd->data);
  return nullptr;
#else
  size_t size = 0;
  const uint8_t* data =
      av_stream_get_side_data(const_cast<AVStream*>(st), AV_PKT_DATA_DISPLAYMATRIX, &size);
  if (data && size >= 9 * sizeof(int32_t)) return reinterpret_cast<const int32_t*>(data);
  return nullptr;
#endif
}

// Clockwise rotation, in quarter turns (0..3), that brings coded frames to display orientation;
// the same rounding as the ffmpeg CLI's autorotate. Non-right angles are ignored (0).
int clockwise_quarter_turns(const AVStream* st) {
  const int32_t* m = display_matrix(st);
  if (!m) return 0;
  double theta = -av_display_rotation_get(m);  // counter-clockwise -> clockwise degrees
  if (!std::isfinite(theta)) return 0;
  theta -= 360 * std::floor(theta / 360 + 0.9 / 360);  // [0, 360)
  for (int q = 1; q < 4; ++q)
    if (std::fabs(theta - 90.0 * q) < 1.0) return q;
  return 0;
}

double stream_fps(AVFormatContext* fmt, AVStream* st) {
  AVRational r = st->avg_frame_rate;
  if (r.num <= 0 || r.den <= 0) r = av_guess_frame_rate(fmt, st, nullptr);
  if (r.num <= 0 || r.den <= 0) return 0;
  return av_q2d(r);
}

// Frame-count estimate for the first allocation; the buffer grows if it is short.
int64_t estimate_frames(const AVStream* st, double fps) {
  if (st->nb_frames > 0) return st->nb_frames;
  if (st->duration != AV_NOPTS_VALUE && st->duration > 0 && fps > 0)
    return static_cast<int64_t>(std::ceil(st->duration * av_q2d(st->time_base) * fps)) + 1;
  return 64;
}

// Converts decoded frames into consecutive slots of a growing [cap, H, W, 3] uint8 tensor.
class RgbWriter {
 public:
  RgbWriter(const std::string& path, int64_t max_frames) : path_(path), max_frames_(max_frames) {}

  int64_t count() const { return n_; }
  bool full() const { return max_frames_ > 0 && n_ >= max_frames_; }

  void add(const AVFrame* f, int64_t estimate) {
    VIDIT_CHECK(f->width > 0 && f->height > 0 && f->format >= 0, "video '", path_,
                "': the decoder returned a frame with no picture (", f->width, "x", f->height,
                ", format ", f->format, "); the file is probably corrupt");
    if (n_ == 0) start(f, estimate);
    if (n_ == cap_) grow();

    // One libswscale context per source geometry/format (a mid-stream change gets a new one).
    // Not sws_getCachedContext: libswscale edits the flags it was given (e.g. forcing full
    // chroma for 4:4:4 input), so that would rebuild the context on every frame.
    const char* fmt_name = av_get_pix_fmt_name(static_cast<AVPixelFormat>(f->format));
    const SourceKey source{f->width, f->height, f->format};
    if (!sws_ || !(source == source_)) {
      sws_.reset(sws_getContext(f->width, f->height, static_cast<AVPixelFormat>(f->format),
                                static_cast<int>(width_), static_cast<int>(height_),
                                AV_PIX_FMT_RGB24, SWS_BICUBIC, nullptr, nullptr, nullptr));
      VIDIT_CHECK(sws_, "video '", path_, "': libswscale cannot convert ", f->width, "x",
                  f->height, " ", fmt_name ? fmt_name : "unknown pixel format", " to ", width_,
                  "x", height_, " rgb24; re-encode the file to a common pixel format such as "
                  "yuv420p");
      source_ = source;
      color_ = ColorKey{};
    }
    SwsContext* s = sws_.get();

    // Colour matrix and range as the frame declares them (BT.601 when unspecified), set the way
    // the ffmpeg CLI's scale filter sets them, so output matches `ffmpeg -pix_fmt rgb24`.
    const int src_full = f->color_range == AVCOL_RANGE_JPEG || is_jpeg_range_format(f->format);
    const ColorKey color{f->colorspace, src_full};
    if (!(color == color_)) {
      // Only the source side changes; the destination keeps the context's own settings
      // (RGB output is full range by definition), exactly as the CLI's scale filter does.
      int* inv_table = nullptr;
      int* table = nullptr;
      int cur_src_full = 0, dst_full = 0, brightness = 0, contrast = 0, saturation = 0;
      int ret = sws_getColorspaceDetails(s, &inv_table, &cur_src_full, &table, &dst_full,
                                         &brightness, &contrast, &saturation);
      VIDIT_CHECK(ret >= 0 || !is_yuv_format(f->format), "video '", path_,
                  "': libswscale cannot report the colour settings for ",
                  fmt_name ? fmt_name : "?", " frames");
      const int* coeffs = sws_getCoefficients(f->colorspace);
      if (ret >= 0)
        ret = sws_setColorspaceDetails(s, coeffs, src_full, coeffs, dst_full, brightness, contrast,
                                       saturation);
      // Not applicable (and refused) for RGB/grey sources; a YUV source must get its matrix.
      VIDIT_CHECK(ret >= 0 || !is_yuv_format(f->format), "video '", path_,
                  "': libswscale refused the colour matrix of ", fmt_name ? fmt_name : "?",
                  " frames (colorspace ", av_color_space_name(f->colorspace), ")");
      color_ = color;
    }

    int ret = sws_scale(s, f->data, f->linesize, 0, f->height, rgb_->data, rgb_->linesize);
    VIDIT_CHECK(ret > 0, "video '", path_, "': converting frame ", n_, " to RGB failed",
                ret < 0 ? ": " + av_error_text(ret) : std::string());

    uint8_t* dst = frames_.data_ptr<uint8_t>() + n_ * height_ * width_ * 3;
    const int64_t row = width_ * 3;
    for (int64_t y = 0; y < height_; ++y)
      std::memcpy(dst + y * row, rgb_->data[0] + y * rgb_->linesize[0], row);
    ++n_;
  }

  // The [n, H, W, 3] result (the buffer's unused tail is dropped).
  at::Tensor take() {
    if (n_ == cap_) return std::move(frames_);
    return frames_.narrow(0, 0, n_).clone();
  }

 private:
  struct SourceKey {
    int width = 0, height = 0, format = -1;
    bool operator==(const SourceKey&) const = default;
  };
  struct ColorKey {
    int colorspace = -1, full = -1;  // -1: not set on the current context yet
    bool operator==(const ColorKey&) const = default;
  };

  void start(const AVFrame* f, int64_t estimate) {
    width_ = f->width;
    height_ = f->height;
    const int64_t frame_bytes = width_ * height_ * 3;
    // A bogus frame count in a header must not allocate gigabytes up front.
    const int64_t limit = std::max<int64_t>(1, (int64_t{1} << 30) / frame_bytes);
    cap_ = std::clamp<int64_t>(estimate, 1, limit);
    if (max_frames_ > 0) cap_ = std::min(cap_, max_frames_);
    frames_ = at::empty({cap_, height_, width_, 3}, at::kByte);

    rgb_.reset(av_frame_alloc());
    VIDIT_CHECK(rgb_, "video '", path_, "': out of memory allocating an RGB frame");
    rgb_->format = AV_PIX_FMT_RGB24;
    rgb_->width = static_cast<int>(width_);
    rgb_->height = static_cast<int>(height_);
    int ret = av_frame_get_buffer(rgb_.get(), 0);  // aligned rows, as the CLI's filters use
    VIDIT_CHECK(ret >= 0, "video '", path_, "': allocating a ", width_, "x", height_,
                " RGB frame failed: ", av_error_text(ret));
  }

  void grow() {
    int64_t cap = cap_ * 2;
    if (max_frames_ > 0) cap = std::min(cap, max_frames_);
    at::Tensor bigger = at::empty({cap, height_, width_, 3}, at::kByte);
    bigger.narrow(0, 0, n_).copy_(frames_.narrow(0, 0, n_));
    frames_ = std::move(bigger);
    cap_ = cap;
  }

  std::string path_;
  int64_t max_frames_;
  int64_t n_ = 0, cap_ = 0, width_ = 0, height_ = 0;
  at::Tensor frames_;
  SwsPtr sws_;
  SourceKey source_;
  ColorKey color_;
  FramePtr rgb_;
};

}  // namespace

bool video_decoding_available() { return true; }

DecodedVideo decode_video(const std::string& path, int64_t max_frames, int threads) {
  VIDIT_CHECK(max_frames == -1 || max_frames > 0, "decode_video('", path,
              "'): max_frames must be -1 (all frames) or > 0, got ", max_frames);
  VIDIT_CHECK(threads >= 0, "decode_video('", path,
              "'): threads must be >= 0 (0 = automatic), got ", threads);
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  VIDIT_CHECK(std::filesystem::exists(status), "video file '", path,
              "' does not exist (check the path and the working directory)");
  VIDIT_CHECK(!std::filesystem::is_directory(status), "video file '", path,
              "' is a directory, not a video file");
  quiet_ffmpeg_logs();

  // "file:" keeps libavformat from reading a colon in the path as a protocol name.
  const std::string url = "file:" + path;
  AVFormatContext* raw_fmt = nullptr;
  int ret = avformat_open_input(&raw_fmt, url.c_str(), nullptr, nullptr);  // frees on failure
  VIDIT_CHECK(ret >= 0, "cannot open video file '", path, "': ", av_error_text(ret),
              " (FFmpeg does not recognise it as a media file; is it a complete, valid video?)");
  FormatPtr fmt(raw_fmt);
  ret = avformat_find_stream_info(fmt.get(), nullptr);
  VIDIT_CHECK(ret >= 0, "cannot read the stream information of video file '", path,
              "': ", av_error_text(ret), " (the file is probably truncated or corrupt)");

  int si = av_find_best_stream(fmt.get(), AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
  if (si >= 0 && (fmt->streams[si]->disposition & AV_DISPOSITION_ATTACHED_PIC)) {
    si = -1;  // cover art is a still image, not the clip; look for a real video stream
    for (unsigned i = 0; i < fmt->nb_streams && si < 0; ++i) {
      const AVStream* st = fmt->streams[i];
      if (st->codecpar->codec_type == AVMEDIA_TYPE_VIDEO &&
          !(st->disposition & AV_DISPOSITION_ATTACHED_PIC))
        si = static_cast<int>(i);
    }
  }
  VIDIT_CHECK(si >= 0, "'", path, "' has no video stream (", describe_streams(fmt.get()),
              "); pass a video file");
  AVStream* st = fmt->streams[si];

  const AVCodec* codec = avcodec_find_decoder(st->codecpar->codec_id);
  VIDIT_CHECK(codec, "video file '", path, "': codec '", avcodec_get_name(st->codecpar->codec_id),
              "' has no decoder in this FFmpeg build; re-encode the file (e.g. "
              "`ffmpeg -i IN -c:v libx264 OUT.mp4`) or use an FFmpeg with that decoder");
  CodecPtr dec(avcodec_alloc_context3(codec));
  VIDIT_CHECK(dec, "video file '", path, "': out of memory allocating the ", codec->name,
              " decoder");
  ret = avcodec_parameters_to_context(dec.get(), st->codecpar);
  VIDIT_CHECK(ret >= 0, "video file '", path, "': cannot configure the ", codec->name,
              " decoder from the stream parameters: ", av_error_text(ret));
  dec->thread_count = threads;
  dec->thread_type = FF_THREAD_FRAME | FF_THREAD_SLICE;
  dec->pkt_timebase = st->time_base;
  ret = avcodec_open2(dec.get(), codec, nullptr);
  VIDIT_CHECK(ret >= 0, "video file '", path, "': cannot open the ", codec->name, " decoder: ",
              av_error_text(ret), " (unsupported codec profile or corrupt codec header)");

  const double fps = stream_fps(fmt.get(), st);
  const int64_t estimate = estimate_frames(st, fps);
  PacketPtr pkt(av_packet_alloc());
  FramePtr frame(av_frame_alloc());
  VIDIT_CHECK(pkt && frame, "video file '", path, "': out of memory allocating a packet/frame");
  RgbWriter out(path, max_frames);
  int last_error = 0;         // the latest decode/read error, reported if nothing decodes
  int64_t bad_packets = 0;

  // Moves every frame the decoder has ready into `out`. Returns false once max_frames is reached.
  auto drain = [&]() -> bool {
    while (!out.full()) {
      int r = avcodec_receive_frame(dec.get(), frame.get());
      if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return true;
      if (r < 0) {  // a damaged picture: skip it, as the ffmpeg CLI does
        VIDIT_CHECK(r != AVERROR(ENOMEM), "video file '", path, "': out of memory while decoding");
        last_error = r;
        if (++bad_packets > 100000) return true;  // cannot loop forever on a broken decoder
        continue;
      }
      out.add(frame.get(), estimate);
      av_frame_unref(frame.get());
    }
    return false;
  };

  bool more = true;
  while (more) {
    ret = av_read_frame(fmt.get(), pkt.get());
    if (ret == AVERROR(EAGAIN)) continue;
    if (ret < 0) {
      // End of file, or data that cannot be demuxed further (a truncated file ends here).
      if (ret != AVERROR_EOF) last_error = ret;
      break;
    }
    if (pkt->stream_index == si) {
      ret = avcodec_send_packet(dec.get(), pkt.get());
      if (ret == AVERROR(EAGAIN)) {  // decoder full: take its frames, then resend
        more = drain();
        if (more) ret = avcodec_send_packet(dec.get(), pkt.get());
      }
      if (more && ret < 0) {
        VIDIT_CHECK(ret != AVERROR(ENOMEM) && ret != AVERROR(EINVAL), "video file '", path,
                    "': the ", codec->name, " decoder failed: ", av_error_text(ret));
        last_error = ret;  // a corrupt packet: skip it
        ++bad_packets;
      }
      if (more) more = drain();
    }
    av_packet_unref(pkt.get());
  }
  if (more) {
    // Flush: a NULL packet makes the decoder return the frames it still holds (B-frame
    // reordering and frame threads keep several), without which the clip's tail is lost.
    // With frame threads, a worker's error on an earlier corrupt packet can surface here; it is
    // no reason to drop the frames that did decode.
    // (Sending the flush packet again after such an error answers AVERROR_EOF once accepted.)
    for (int attempt = 0; attempt < 16 && more; ++attempt) {
      ret = avcodec_send_packet(dec.get(), nullptr);
      VIDIT_CHECK(ret != AVERROR(ENOMEM) && ret != AVERROR(EINVAL), "video file '", path,
                  "': flushing the ", codec->name, " decoder failed: ", av_error_text(ret));
      if (ret >= 0 || ret == AVERROR_EOF) break;
      last_error = ret;
      more = drain();
    }
    if (more) drain();
  }

  VIDIT_CHECK(out.count() > 0, "no frame could be decoded from video file '", path, "' (",
              codec->name, " stream #", si, ", ", bad_packets, " bad packet(s)",
              last_error ? ", last error: " + av_error_text(last_error) : std::string(),
              "); the file is corrupt or truncated");

  DecodedVideo v;
  v.frames = out.take();
  if (int q = clockwise_quarter_turns(st); q != 0)
    v.frames = at::rot90(v.frames, -q, {1, 2}).contiguous();  // k < 0: clockwise in (H, W)
  v.fps = fps;
  v.height = v.frames.size(1);
  v.width = v.frames.size(2);
  return v;
}

}  // namespace vidit

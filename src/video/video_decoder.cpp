// decode_video with FFmpeg: libavformat demux and seek, libavcodec decode (software, or NVDEC via
// decode_nvdec.h), frames chosen by timestamp (decode_frame_picker.h), libswscale to RGB24.
// Compiled only when CMake finds the FFmpeg development libraries; video_decoder_stub.cpp
// replaces this file otherwise. encode_video_mp4 lives in video_encoder.cpp (FFmpeg builds too).
#include "video/video_decoder.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <system_error>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/error.h"
#include "video/decode_frame_picker.h"
#include "video/decode_nvdec.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/avutil.h>
#include <libavutil/display.h>
#include <libavutil/frame.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

#include "video/ffmpeg_handles.h"

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
using FormatPtr = std::unique_ptr<AVFormatContext, FormatCloser>;
using ffmpeg::CodecPtr;
using ffmpeg::FramePtr;
using ffmpeg::PacketPtr;
using ffmpeg::SwsPtr;

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

// An output buffer is written once, front to back. Where transparent huge pages are opt-in
// (Linux's "madvise" mode, the common default), ask for them on large buffers so that filling
// one costs a page fault per 2 MB instead of per 4 KB: measured 1.7x the frames/s on 640x360
// H.264 with 2 threads (bench_decode). Advice only; nothing depends on it being taken.
void advise_huge_pages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (bytes < 2 * kHuge) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#endif
}

// Converts decoded frames into consecutive slots of a growing [cap, H, W, 3] uint8 tensor.
class RgbWriter {
 public:
  RgbWriter(const std::string& path, int64_t max_frames) : path_(path), max_frames_(max_frames) {}

  int64_t count() const { return n_; }
  int64_t height() const { return height_; }
  int64_t width() const { return width_; }
  // Streaming (a writer of one slot): the frame just added, then make room again.
  at::Tensor first() const { return frames_[0]; }
  void rewind() { n_ = 0; }

  // Appends `copies` (>= 1) slots showing `f`, converted once. The first frame fixes the output
  // size: its height, and `width` (its own width unless square-pixel stretching asks otherwise).
  // `estimate` sizes the first allocation; the buffer grows if it is short.
  void add(const AVFrame* f, int64_t copies, int64_t width, int64_t estimate) {
    VIDIT_CHECK(f->width > 0 && f->height > 0 && f->format >= 0, "video '", path_,
                "': the decoder returned a frame with no picture (", f->width, "x", f->height,
                ", format ", f->format, "); the file is probably corrupt");
    if (cap_ == 0) start(f, width, estimate);
    if (n_ == cap_) grow(copies);

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

    const int64_t frame_bytes = height_ * width_ * 3;
    uint8_t* dst = frames_.data_ptr<uint8_t>() + n_ * frame_bytes;
    const int64_t row = width_ * 3;
    for (int64_t y = 0; y < height_; ++y)
      std::memcpy(dst + y * row, rgb_->data[0] + y * rgb_->linesize[0], row);
    ++n_;
    for (int64_t c = 1; c < copies; ++c) {  // repeats (resampling up) are plain copies
      if (n_ == cap_) grow(copies - c);
      uint8_t* base = frames_.data_ptr<uint8_t>();
      std::memcpy(base + n_ * frame_bytes, base + (n_ - 1) * frame_bytes, frame_bytes);
      ++n_;
    }
  }

  // The [n, H, W, 3] result. A short unused tail (at most 1/8 of the buffer: the estimate was a
  // little high) stays allocated behind a view, which is still contiguous; a copy of hundreds of
  // MB would cost more than decoding. A long one is dropped by copying.
  at::Tensor take() {
    if (n_ == cap_) return std::move(frames_);
    if ((cap_ - n_) * 8 <= cap_) return frames_.narrow(0, 0, n_);
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

  void start(const AVFrame* f, int64_t width, int64_t estimate) {
    width_ = width;
    height_ = f->height;
    const int64_t frame_bytes = width_ * height_ * 3;
    // A bogus frame count in a header must not allocate gigabytes up front.
    const int64_t limit = std::max<int64_t>(1, (int64_t{1} << 30) / frame_bytes);
    cap_ = std::clamp<int64_t>(estimate, 1, limit);
    if (max_frames_ > 0) cap_ = std::min(cap_, max_frames_);
    frames_ = at::empty({cap_, height_, width_, 3}, at::kByte);
    advise_huge_pages(frames_.data_ptr(), static_cast<size_t>(frames_.nbytes()));

    rgb_.reset(av_frame_alloc());
    VIDIT_CHECK(rgb_, "video '", path_, "': out of memory allocating an RGB frame");
    rgb_->format = AV_PIX_FMT_RGB24;
    rgb_->width = static_cast<int>(width_);
    rgb_->height = static_cast<int>(height_);
    int ret = av_frame_get_buffer(rgb_.get(), 0);  // aligned rows, as the CLI's filters use
    VIDIT_CHECK(ret >= 0, "video '", path_, "': allocating a ", width_, "x", height_,
                " RGB frame failed: ", av_error_text(ret));
  }

  // Makes room for at least one more slot (doubling; `wanted` more if that is larger).
  void grow(int64_t wanted) {
    int64_t cap = std::max(cap_ * 2, n_ + wanted);
    if (max_frames_ > 0) cap = std::min(cap, max_frames_);
    at::Tensor bigger = at::empty({cap, height_, width_, 3}, at::kByte);
    advise_huge_pages(bigger.data_ptr(), static_cast<size_t>(bigger.nbytes()));
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

// An open file: demuxer, the chosen video stream and its (opened) decoder.
struct Source {
  FormatPtr fmt;
  AVStream* st = nullptr;
  int si = -1;
  const AVCodec* codec = nullptr;
  nvdec::Session hw;     // read through dec->opaque: declared before dec, so it outlives it
  bool on_gpu = false;   // the decoder has the CUDA device attached
  CodecPtr dec;
};

// How to decode: software (cuda == nullptr) or NVDEC on `cuda`; strict: NVDEC or an error.
struct Backend {
  AVBufferRef* cuda = nullptr;
  bool strict = false;
};

// Opens `path` and its video stream's decoder. Not movable once opened (dec->opaque points
// into it), hence the unique_ptr.
std::unique_ptr<Source> open_source(const std::string& path, int threads, const Backend& backend,
                                    int64_t byte_offset = 0, int64_t byte_size = -1) {
  auto src = std::make_unique<Source>();
  // "file:" keeps libavformat from reading a colon in the path as a protocol name. A byte range
  // (a tar member) goes through the subfile protocol: the stream starts at its first byte and ends
  // at its last, as if it were a file of its own.
  std::string url = "file:" + path;
  if (byte_size >= 0)
    url = "subfile,,start," + std::to_string(byte_offset) + ",end," + std::to_string(byte_offset + byte_size) + ",,:" + url;
  AVFormatContext* raw_fmt = nullptr;
  int ret = avformat_open_input(&raw_fmt, url.c_str(), nullptr, nullptr);  // frees on failure
  VIDIT_CHECK(ret >= 0, "cannot open video file '", path, "': ", av_error_text(ret),
              " (FFmpeg does not recognise it as a media file; is it a complete, valid video?)");
  src->fmt.reset(raw_fmt);
  AVFormatContext* fmt = src->fmt.get();
  ret = avformat_find_stream_info(fmt, nullptr);
  VIDIT_CHECK(ret >= 0, "cannot read the stream information of video file '", path,
              "': ", av_error_text(ret), " (the file is probably truncated or corrupt)");

  int si = av_find_best_stream(fmt, AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
  if (si >= 0 && (fmt->streams[si]->disposition & AV_DISPOSITION_ATTACHED_PIC)) {
    si = -1;  // cover art is a still image, not the clip; look for a real video stream
    for (unsigned i = 0; i < fmt->nb_streams && si < 0; ++i) {
      const AVStream* st = fmt->streams[i];
      if (st->codecpar->codec_type == AVMEDIA_TYPE_VIDEO &&
          !(st->disposition & AV_DISPOSITION_ATTACHED_PIC))
        si = static_cast<int>(i);
    }
  }
  VIDIT_CHECK(si >= 0, "'", path, "' has no video stream (", describe_streams(fmt),
              "); pass a video file");
  src->si = si;
  src->st = fmt->streams[si];
  const AVCodecID codec_id = src->st->codecpar->codec_id;

  if (backend.cuda) src->codec = nvdec::find_decoder(codec_id);
  VIDIT_CHECK(src->codec || !backend.strict, "video file '", path, "': device=nvdec, but codec '",
              avcodec_get_name(codec_id), "' has no NVDEC (cuda hwaccel) decoder in this FFmpeg "
              "build; use device=auto or cpu");
  src->on_gpu = src->codec != nullptr;
  if (!src->codec) src->codec = avcodec_find_decoder(codec_id);
  const AVCodec* codec = src->codec;
  VIDIT_CHECK(codec, "video file '", path, "': codec '", avcodec_get_name(codec_id),
              "' has no decoder in this FFmpeg build; re-encode the file (e.g. "
              "`ffmpeg -i IN -c:v libx264 OUT.mp4`) or use an FFmpeg with that decoder");
  src->dec.reset(avcodec_alloc_context3(codec));
  AVCodecContext* dec = src->dec.get();
  VIDIT_CHECK(dec, "video file '", path, "': out of memory allocating the ", codec->name,
              " decoder");
  ret = avcodec_parameters_to_context(dec, src->st->codecpar);
  VIDIT_CHECK(ret >= 0, "video file '", path, "': cannot configure the ", codec->name,
              " decoder from the stream parameters: ", av_error_text(ret));
  dec->thread_count = threads;
  dec->thread_type = FF_THREAD_FRAME | FF_THREAD_SLICE;
  dec->pkt_timebase = src->st->time_base;
  if (src->on_gpu) {
    src->hw.strict = backend.strict;
    nvdec::attach(dec, backend.cuda, &src->hw, path);
  }
  ret = avcodec_open2(dec, codec, nullptr);
  VIDIT_CHECK(ret >= 0, "video file '", path, "': cannot open the ", codec->name, " decoder",
              src->on_gpu ? " on NVDEC" : "", ": ", av_error_text(ret),
              " (unsupported codec profile or corrupt codec header)");
  return src;
}

int64_t seconds_to_us(double s) { return std::llround(s * 1e6); }

#if LIBAVUTIL_VERSION_INT >= AV_VERSION_INT(57, 30, 100)
int64_t frame_duration(const AVFrame* f) { return f->duration; }
#else
int64_t frame_duration(const AVFrame* f) { return f->pkt_duration; }
#endif

// One decode_video call: demux, (seek,) decode, pick frames by time, convert to RGB.
class ClipDecoder {
 public:
  // With a sink, frames go to it one by one (skipping the first `skip`) instead of into the result.
  ClipDecoder(const std::string& path, const DecodeOptions& o, const Backend& backend,
              const FrameSink* sink = nullptr, int64_t skip = 0)
      : path_(path), o_(o), backend_(backend), out_(path, sink ? 1 : o.max_frames), sink_(sink),
        skip_(skip) {}

  // Frames handed to the sink, or skipped as already delivered (streaming).
  int64_t delivered() const { return delivered_; }
  bool sink_failed() const { return sink_error_ != nullptr; }

  DecodedVideo run() {
    src_ = open_source(path_, o_.threads, backend_, o_.byte_offset, o_.byte_size);
    if (on_gpu_started_) *on_gpu_started_ = src_->on_gpu;
    setup_clock();
    pkt_.reset(av_packet_alloc());
    frame_.reset(av_frame_alloc());
    held_.reset(av_frame_alloc());
    host_.reset(av_frame_alloc());
    VIDIT_CHECK(pkt_ && frame_ && held_ && host_, "video file '", path_,
                "': out of memory allocating a packet/frame");

    Flow flow = Flow::kMore;
    if (o_.start_seconds > 0) {
      for (int attempt = 0;; ++attempt) {
        position(attempt);
        flow = decode_all();
        if (flow != Flow::kReseek) break;
      }
    } else {
      flow = decode_all();
    }
    if (flow == Flow::kMore && last_pts_ != AV_NOPTS_VALUE) {  // end of stream
      const int64_t stop = last_pts_ + std::max<int64_t>(last_duration_, 0);
      emit_held(picker_->finish(stop));
    }
    if (sink_error_) std::rethrow_exception(sink_error_);
    return result();
  }

  // Set to whether the decoder runs on NVDEC, as soon as that is known (before decoding).
  void report_gpu_to(bool* flag) { on_gpu_started_ = flag; }

 private:
  enum class Flow { kMore, kDone, kReseek };

  // Stream time base, clip window and output grid in stream ticks.
  void setup_clock() {
    AVStream* st = src_->st;
    tb_ = st->time_base;
    const AVFormatContext* fmt = src_->fmt.get();
    // Clip times count from the file's start time, as the ffmpeg CLI's -ss does.
    const int64_t file_start_us = fmt->start_time != AV_NOPTS_VALUE ? fmt->start_time : 0;
    start_ = av_rescale_q(file_start_us + seconds_to_us(o_.start_seconds), AV_TIME_BASE_Q, tb_);
    origin_seconds_ = file_start_us / 1e6;
    const int64_t end = std::isinf(o_.end_seconds)
                            ? FramePicker::kNoEnd
                            : av_rescale_q(file_start_us + seconds_to_us(o_.end_seconds),
                                           AV_TIME_BASE_Q, tb_);
    stream_first_ = st->start_time != AV_NOPTS_VALUE ? st->start_time
                                                     : av_rescale_q(file_start_us, AV_TIME_BASE_Q, tb_);
    stream_fps_ = stream_fps(src_->fmt.get(), st);
    if (o_.target_fps > 0) out_rate_ = av_d2q(o_.target_fps, INT_MAX);
    // Without a start, nothing is dropped (frames before the file's start time included), as
    // the CLI does without -ss; the resampling grid still starts at the file's start time.
    const int64_t begin = o_.start_seconds > 0 ? start_ : std::numeric_limits<int64_t>::min();
    picker_.emplace(FramePicker::Rational{tb_.num, tb_.den}, start_, begin, end,
                    FramePicker::Rational{out_rate_.num, out_rate_.den}, o_.max_frames);

    // First allocation: the window's length (or the stream's) at the output rate.
    double seconds = -1;
    if (st->duration != AV_NOPTS_VALUE && st->duration > 0) seconds = st->duration * av_q2d(tb_);
    else if (fmt->duration != AV_NOPTS_VALUE && fmt->duration > 0) seconds = fmt->duration / 1e6;
    if (seconds >= 0) seconds = std::max(0.0, seconds - o_.start_seconds);
    if (!std::isinf(o_.end_seconds))
      seconds = seconds < 0 ? o_.end_seconds - o_.start_seconds
                            : std::min(seconds, o_.end_seconds - o_.start_seconds);
    const double rate = out_rate_.num > 0 ? av_q2d(out_rate_) : stream_fps_;
    const bool whole_stream = out_rate_.num == 0 && o_.start_seconds <= 0 && std::isinf(o_.end_seconds);
    if (whole_stream && st->nb_frames > 0) estimate_ = st->nb_frames;  // exact where the header knows
    else if (seconds >= 0 && rate > 0) estimate_ = static_cast<int64_t>(std::ceil(seconds * rate)) + 1;
  }

  // Places the demuxer so that decoding forward reaches the clip start, for retry `attempt`.
  // av_seek_frame(BACKWARD) finds the key frame at or before a timestamp, but formats whose
  // index holds decode times (MP4 with B-frames) and open-GOP streams (HEVC CRA leading
  // pictures) can land on a key frame displayed after the start; the first decoded frame tells
  // (verify_). Each retry then seeks to just before the decode time of the first packet it got,
  // which in an indexed file (MP4, Matroska) is the key frame it landed on, so one GOP further
  // back; from the second retry on, also 0.25 s, 0.5 s, 1 s, ... earlier, for formats that seek
  // by bisecting timestamps (MPEG-TS), where that packet is not a key frame. A target at or
  // before the stream's first timestamp, a failed seek, a seek after which no packet came, or an
  // eighth attempt reopens the file and decodes from its beginning, which is always right.
  void position(int attempt) {
    int64_t target = start_;
    bool seekable = attempt < 8;
    if (attempt > 0) {
      seekable = seekable && landed_dts_ != AV_NOPTS_VALUE;
      const int64_t backoff =
          attempt < 2 ? 0 : av_rescale_q(int64_t{250000} << (attempt - 2), AV_TIME_BASE_Q, tb_);
      if (seekable) target = std::min(seek_target_, landed_dts_) - 1 - backoff;
    }
    seek_target_ = target;
    landed_dts_ = AV_NOPTS_VALUE;
    int ret = -1;
    if (seekable && target > stream_first_) {
      ret = av_seek_frame(src_->fmt.get(), src_->si, target, AVSEEK_FLAG_BACKWARD);
      if (ret >= 0) avcodec_flush_buffers(src_->dec.get());
    }
    if (ret < 0) {
      src_ = open_source(path_, o_.threads, backend_, o_.byte_offset, o_.byte_size);
      verify_ = false;
    } else {
      verify_ = true;
    }
    last_pts_ = AV_NOPTS_VALUE;
    last_duration_ = 0;
  }

  // Reads and decodes until the clip is complete (kDone), the stream ends (kMore) or a seek
  // landed too late (kReseek).
  Flow decode_all() {
    AVFormatContext* fmt = src_->fmt.get();
    AVCodecContext* dec = src_->dec.get();
    Flow flow = Flow::kMore;
    while (flow == Flow::kMore) {
      int ret = av_read_frame(fmt, pkt_.get());
      if (ret == AVERROR(EAGAIN)) continue;
      if (ret < 0) {
        // End of file, or data that cannot be demuxed further (a truncated file ends here).
        if (ret != AVERROR_EOF) last_error_ = ret;
        break;
      }
      if (pkt_->stream_index == src_->si) {
        if (verify_ && landed_dts_ == AV_NOPTS_VALUE)  // the first packet after a seek
          landed_dts_ = pkt_->dts != AV_NOPTS_VALUE ? pkt_->dts : pkt_->pts;
        ret = avcodec_send_packet(dec, pkt_.get());
        if (ret == AVERROR(EAGAIN)) {  // decoder full: take its frames, then resend
          flow = drain();
          if (flow == Flow::kMore) ret = avcodec_send_packet(dec, pkt_.get());
        }
        if (flow == Flow::kMore && ret < 0) {
          check_fatal(ret, "the decoder failed");
          last_error_ = ret;  // a corrupt packet: skip it
          ++bad_packets_;
        }
        if (flow == Flow::kMore) flow = drain();
      }
      av_packet_unref(pkt_.get());
    }
    av_packet_unref(pkt_.get());
    if (flow == Flow::kMore) {
      // Flush: a NULL packet makes the decoder return the frames it still holds (B-frame
      // reordering and frame threads keep several), without which the clip's tail is lost.
      // With frame threads, a worker's error on an earlier corrupt packet can surface here; it is
      // no reason to drop the frames that did decode.
      // (Sending the flush packet again after such an error answers AVERROR_EOF once accepted.)
      for (int attempt = 0; attempt < 16 && flow == Flow::kMore; ++attempt) {
        const int ret = avcodec_send_packet(dec, nullptr);
        check_fatal(ret, "flushing the decoder failed");
        if (ret >= 0 || ret == AVERROR_EOF) break;
        last_error_ = ret;
        flow = drain();
      }
      if (flow == Flow::kMore) flow = drain();
    }
    // Not one frame after a seek (a damaged index sent us past the data): look further back.
    if (flow == Flow::kMore && verify_) return Flow::kReseek;
    return flow;
  }

  // Errors that end the decode (rather than skip one damaged packet or picture).
  void check_fatal(int ret, const char* what) {
    VIDIT_CHECK(!(src_->hw.strict && src_->hw.refused), "video file '", path_, "': device=nvdec, "
                "but NVDEC cannot decode this ", src_->codec->name, " stream (a profile, bit "
                "depth, chroma format or size the GPU's decoder lacks); use device=auto or cpu");
    VIDIT_CHECK(ret != AVERROR(ENOMEM) && ret != AVERROR(EINVAL), "video file '", path_, "': the ",
                src_->codec->name, src_->on_gpu ? " (NVDEC)" : "", " decoder: ", what, ": ",
                av_error_text(ret));
  }

  // Takes every frame the decoder has ready.
  Flow drain() {
    AVCodecContext* dec = src_->dec.get();
    for (;;) {
      const int r = avcodec_receive_frame(dec, frame_.get());
      if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return Flow::kMore;
      if (r < 0) {  // a damaged picture: skip it, as the ffmpeg CLI does
        check_fatal(r, "decoding failed");
        last_error_ = r;
        if (++bad_packets_ > 100000) return Flow::kMore;  // cannot loop forever on a broken decoder
        continue;
      }
      const Flow flow = on_frame(frame_.get());
      av_frame_unref(frame_.get());
      if (flow != Flow::kMore) return flow;
    }
  }

  Flow on_frame(AVFrame* f) {
    ++decoded_;
    int64_t pts = f->best_effort_timestamp;
    if (pts == AV_NOPTS_VALUE) pts = f->pts;
    if (pts == AV_NOPTS_VALUE)  // no timestamp at all: continue from the previous frame
      pts = last_pts_ == AV_NOPTS_VALUE ? stream_first_ : last_pts_ + std::max<int64_t>(1, last_duration_);
    if (verify_) {
      verify_ = false;
      if (pts > start_) return Flow::kReseek;  // the seek landed after the clip start
    }
    // The last frame's duration ends the stream: its packet's, else the gap before it, else one
    // frame at the stream's average rate.
    int64_t duration = frame_duration(f);
    if (duration <= 0 && last_pts_ != AV_NOPTS_VALUE && pts > last_pts_) duration = pts - last_pts_;
    if (duration <= 0 && stream_fps_ > 0) duration = av_rescale_q(1, av_d2q(1 / stream_fps_, INT_MAX), tb_);
    last_pts_ = pts;
    last_duration_ = duration;

    const FramePicker::Step step = picker_->on_frame(pts);
    emit_held(step.held);
    if (step.now > 0) emit(f, step.now, pts * av_q2d(tb_) - origin_seconds_, 0);
    if (step.hold) {
      av_frame_unref(held_.get());
      const int ret = av_frame_ref(held_.get(), f);
      VIDIT_CHECK(ret >= 0, "video file '", path_, "': out of memory keeping a frame: ",
                  av_error_text(ret));
      holding_ = true;
    }
    return step.done || stopped_ ? Flow::kDone : Flow::kMore;
  }

  void emit_held(const FramePicker::Run& run) {
    if (run.copies <= 0 || !holding_) return;
    emit(held_.get(), run.copies, picker_->slot_seconds(run.first_slot) - origin_seconds_,
         1.0 / av_q2d(out_rate_));
  }

  // Appends `copies` outputs of `f`, the first at `seconds` (clip time), then `step` apart.
  void emit(const AVFrame* f, int64_t copies, double seconds, double step) {
    if (stopped_) return;
    const AVFrame* host = nvdec_host(f);
    if (sink_) {
      set_geometry(host, delivered_ == 0);
      out_.add(host, 1, out_width_, 1);
      at::Tensor frame = out_.first();
      if (int q = clockwise_quarter_turns(src_->st); q != 0) frame = at::rot90(frame, -q, {0, 1}).contiguous();
      for (int64_t c = 0; c < copies && !stopped_; ++c) {
        const double t = seconds + c * step;
        timestamps_.push_back(t);
        if (delivered_++ < skip_) continue;
        try {
          if (!(*sink_)(frame, t)) stopped_ = true;
        } catch (...) {  // the caller's error, not the decoder's: rethrown by run(), never retried
          sink_error_ = std::current_exception();
          stopped_ = true;
        }
      }
      out_.rewind();
      return;
    }
    set_geometry(host, out_.count() == 0);
    out_.add(host, copies, out_width_, estimate_);
    for (int64_t c = 0; c < copies; ++c) timestamps_.push_back(seconds + c * step);
  }

  // The first output frame fixes the pixel aspect ratio and the output width.
  void set_geometry(const AVFrame* host, bool first) {
    if (first) {
      const AVRational sar = av_guess_sample_aspect_ratio(src_->fmt.get(), src_->st,
                                                          const_cast<AVFrame*>(host));
      sar_ = sar.num > 0 && sar.den > 0 ? sar : AVRational{1, 1};
      av_reduce(&sar_.num, &sar_.den, sar_.num, sar_.den, INT_MAX);
      out_width_ = host->width;
      if (o_.square_pixels && sar_.num != sar_.den) {
        out_width_ = std::max<int64_t>(1, av_rescale(host->width, sar_.num, sar_.den));
        sar_ = AVRational{1, 1};
      }
    }
  }

  const AVFrame* nvdec_host(const AVFrame* f) {
    if (!src_->on_gpu) return f;
    return nvdec::to_host(f, host_.get(), path_);
  }

  DecodedVideo result() {
    AVFormatContext* fmt = src_->fmt.get();
    VIDIT_CHECK(decoded_ > 0, "no frame could be decoded from video file '", path_, "' (",
                src_->codec->name, src_->on_gpu ? " on NVDEC" : "", " stream #", src_->si, ", ",
                bad_packets_, " bad packet(s)",
                last_error_ ? ", last error: " + av_error_text(last_error_) : std::string(),
                "); the file is corrupt or truncated");
    VIDIT_CHECK((sink_ ? delivered_ : out_.count()) > 0, "video file '", path_, "' has no frame in the clip window [",
                o_.start_seconds, ", ", o_.end_seconds, ") seconds (the file lasts ",
                fmt->duration != AV_NOPTS_VALUE ? std::to_string(fmt->duration / 1e6) + " s"
                                                : std::string("an unknown time"),
                "); choose a window inside the video");
    DecodedVideo v;
    const int q = clockwise_quarter_turns(src_->st);
    if (!sink_) {
      v.frames = out_.take();
      if (q != 0) v.frames = at::rot90(v.frames, -q, {1, 2}).contiguous();  // k < 0: clockwise in (H, W)
      v.height = v.frames.size(1);
      v.width = v.frames.size(2);
    } else {
      const int64_t h = out_.height(), w = out_.width();
      v.height = q % 2 ? w : h;
      v.width = q % 2 ? h : w;
    }
    if (q % 2) std::swap(sar_.num, sar_.den);
    v.fps = out_rate_.num > 0 ? av_q2d(out_rate_) : stream_fps_;
    v.sar_num = sar_.num;
    v.sar_den = sar_.den;
    v.timestamps = std::move(timestamps_);
    v.frames_decoded = decoded_;
    return v;
  }

  const std::string& path_;
  const DecodeOptions& o_;
  Backend backend_;
  bool* on_gpu_started_ = nullptr;
  std::unique_ptr<Source> src_;
  PacketPtr pkt_;
  FramePtr frame_, held_, host_;
  RgbWriter out_;
  const FrameSink* sink_ = nullptr;
  std::exception_ptr sink_error_;
  int64_t skip_ = 0, delivered_ = 0;
  bool stopped_ = false;       // the sink asked to stop
  std::vector<double> timestamps_;
  std::optional<FramePicker> picker_;

  AVRational tb_{1, 1};
  AVRational out_rate_{0, 1};  // 0: native rate
  int64_t start_ = 0;          // clip start (and resampling origin), stream ticks
  int64_t stream_first_ = 0;   // the stream's first timestamp, stream ticks
  double origin_seconds_ = 0;  // the file's start time, seconds
  double stream_fps_ = 0;
  int64_t estimate_ = 64;      // output frames expected, for the first allocation
  bool verify_ = false;        // the next frame is the first after a seek
  int64_t seek_target_ = 0;    // the latest seek's target, stream ticks
  int64_t landed_dts_ = AV_NOPTS_VALUE;  // decode time of the first packet after that seek
  bool holding_ = false;
  int64_t last_pts_ = AV_NOPTS_VALUE, last_duration_ = 0;
  int64_t decoded_ = 0, bad_packets_ = 0;
  int last_error_ = 0;         // the latest decode/read error, reported if nothing decodes
  AVRational sar_{1, 1};
  int64_t out_width_ = 0;
};

void check_options(const std::string& path, const DecodeOptions& o) {
  const auto bad = [&](auto... parts) { fail("decode_video('", path, "'): ", parts...); };
  if (!(std::isfinite(o.start_seconds) && o.start_seconds >= 0))
    bad("start_seconds must be finite and >= 0, got ", o.start_seconds);
  if (!(o.end_seconds > o.start_seconds))
    bad("end_seconds must be > start_seconds (", o.start_seconds, "), got ", o.end_seconds);
  if (!(o.max_frames == -1 || o.max_frames > 0))
    bad("max_frames must be -1 (all frames) or > 0, got ", o.max_frames);
  if (!(std::isfinite(o.target_fps) && o.target_fps >= 0 && o.target_fps < 1e6))
    bad("target_fps must be 0 (native rate) or a positive frame rate, got ", o.target_fps);
  if (o.threads < 0) bad("threads must be >= 0 (0 = automatic), got ", o.threads);
  if (o.cuda_device < -1) bad("cuda_device must be >= 0, or -1 for automatic, got ", o.cuda_device);
  if (o.byte_size >= 0 && o.byte_offset < 0) bad("byte_offset must be >= 0, got ", o.byte_offset);
}

}  // namespace

bool video_decoding_available() { return true; }

namespace {

// decode_video and decode_video_streaming: `sink` null collects the frames, else hands them on.
DecodedVideo decode(const std::string& path, const DecodeOptions& options, const FrameSink* sink) {
  check_options(path, options);
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  VIDIT_CHECK(std::filesystem::exists(status), "video file '", path,
              "' does not exist (check the path and the working directory)");
  VIDIT_CHECK(!std::filesystem::is_directory(status), "video file '", path,
              "' is a directory, not a video file");
  quiet_ffmpeg_logs();

  if (options.device == DecodeDevice::kCpu) return ClipDecoder(path, options, {}, sink).run();

  std::string why;
  const int gpu = nvdec::resolve_device_index(options.cuda_device);
  AVBufferRef* cuda = nvdec::cuda_device(gpu, &why);
  if (options.device == DecodeDevice::kNvdec) {
    VIDIT_CHECK(cuda, "cannot decode video file '", path, "' with device=nvdec: ", why,
                "; use device=auto (falls back to software) or cpu");
    return ClipDecoder(path, options, {cuda, true}, sink).run();
  }
  if (!cuda) {
    nvdec::log_software_fallback(why);
    return ClipDecoder(path, options, {}, sink).run();
  }
  // auto with a GPU: NVDEC where it has a decoder for the codec. A stream it starts on and then
  // cannot finish (an unsupported profile the native AV1 decoder has no software path for, a
  // driver error) is decoded again in software; the frames a sink already has are skipped (the
  // same times, so the same frames).
  bool on_gpu = false;
  ClipDecoder d(path, options, {cuda, false}, sink);
  try {
    d.report_gpu_to(&on_gpu);
    return d.run();
  } catch (const Error& e) {
    if (!on_gpu || d.sink_failed()) throw;
    nvdec::log_software_fallback(std::string("NVDEC failed on '") + path + "': " + e.what());
    return ClipDecoder(path, options, {}, sink, d.delivered()).run();
  }
}

}  // namespace

DecodedVideo decode_video(const std::string& path, const DecodeOptions& options) {
  return decode(path, options, nullptr);
}

DecodedVideo decode_video_streaming(const std::string& path, const DecodeOptions& options, const FrameSink& sink) {
  VIDIT_CHECK(sink, "decode_video_streaming('", path, "'): no frame sink given");
  return decode(path, options, &sink);
}

double probe_video_seconds(const std::string& path, int64_t byte_offset, int64_t byte_size) {
  std::error_code ec;
  VIDIT_CHECK(std::filesystem::exists(path, ec), "video file '", path,
              "' does not exist (check the path and the working directory)");
  quiet_ffmpeg_logs();
  std::unique_ptr<Source> src = open_source(path, 1, {}, byte_offset, byte_size);
  const AVFormatContext* fmt = src->fmt.get();
  const AVStream* st = src->st;
  const double file_start = fmt->start_time != AV_NOPTS_VALUE ? fmt->start_time / 1e6 : 0;
  if (st->duration != AV_NOPTS_VALUE && st->duration > 0) {
    const double stream_start = st->start_time != AV_NOPTS_VALUE ? st->start_time * av_q2d(st->time_base) : file_start;
    return stream_start - file_start + st->duration * av_q2d(st->time_base);
  }
  if (fmt->duration != AV_NOPTS_VALUE && fmt->duration > 0) return fmt->duration / 1e6;
  return 0;
}

DecodedVideo decode_video(const std::string& path, int64_t max_frames, int threads) {
  DecodeOptions o;
  o.max_frames = max_frames;
  o.threads = threads;
  o.device = DecodeDevice::kCpu;
  return decode_video(path, o);
}

}  // namespace vidit

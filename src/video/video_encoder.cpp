// encode_video_mp4 with FFmpeg's libraries: libswscale converts each RGB24 frame to YUV 4:4:4
// (BT.709 matrix, limited "tv" range) and does the optional nearest-neighbour upscale in the same
// pass, libavcodec's libx264 encoder compresses (preset medium, the caller's crf), and
// libavformat's mp4 muxer writes the file with its index in front (movflags=+faststart), so
// players can start before the whole file has arrived. These are the settings the `ffmpeg`
// program was once run with here; no program is run now, so a node without the ffmpeg CLI still
// writes its samples.
//
// The file is written under a hidden temporary name in the destination folder and renamed over
// `path` only once the muxer has finished: a failure (or a crash) never leaves a half-written file
// under the final name, and a failed call removes its temporary file.
//
// Compiled in FFmpeg builds only; video_decoder_stub.cpp has the encoder's stub otherwise.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <system_error>

#include "core/error.h"
#include "video/video_decoder.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/avutil.h>
#include <libavutil/dict.h>
#include <libavutil/frame.h>
#include <libavutil/mathematics.h>
#include <libavutil/pixfmt.h>
#include <libavutil/rational.h>
#include <libswscale/swscale.h>
}

#include "video/ffmpeg_handles.h"

namespace vidit {

namespace {

namespace fs = std::filesystem;

// av_err2str is a C compound-literal macro; this is its C++ equivalent.
std::string av_error_text(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  if (av_strerror(err, buf, sizeof(buf)) < 0) std::snprintf(buf, sizeof(buf), "FFmpeg error %d", err);
  return buf;
}

// libx264 reports its settings and statistics at INFO level on every file; keep training logs
// clean (errors still print). A level the application chose is kept. Same rule as the decoder.
void quiet_ffmpeg_logs() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (av_log_get_level() == AV_LOG_INFO) av_log_set_level(AV_LOG_ERROR);
  });
}

// The muxer context and the file it writes: closes the file (if still open), then frees.
struct OutputFreer {
  void operator()(AVFormatContext* c) const {
    if (c->pb && !(c->oformat->flags & AVFMT_NOFILE)) avio_closep(&c->pb);
    avformat_free_context(c);
  }
};
using ffmpeg::CodecPtr;
using ffmpeg::FramePtr;
using ffmpeg::PacketPtr;
using ffmpeg::SwsPtr;
using OutputPtr = std::unique_ptr<AVFormatContext, OutputFreer>;

// An AVDictionary of options that is freed on every path.
struct Options {
  AVDictionary* dict = nullptr;
  Options() = default;
  Options(const Options&) = delete;
  Options& operator=(const Options&) = delete;
  ~Options() { av_dict_free(&dict); }
  // The keys the component did not recognise, comma separated ("" when all were used).
  std::string leftovers() const {
    std::string out;
    const AVDictionaryEntry* e = nullptr;
    while ((e = av_dict_get(dict, "", e, AV_DICT_IGNORE_SUFFIX)))
      out += (out.empty() ? "" : ", ") + std::string(e->key) + "=" + e->value;
    return out;
  }
};

// The temporary file the muxer writes: `.NAME.PID-N-RANDOM.part` next to the destination (same
// folder, so the final rename stays on one filesystem and is atomic; hidden, and not ending in
// .mp4, so folder scans for videos do not pick it up). Removed on destruction unless committed.
class TempOutput {
 public:
  explicit TempOutput(const fs::path& dest) {
    static std::atomic<uint64_t> counter{0};
    thread_local std::mt19937_64 rng{std::random_device{}()};
    char tag[64];
    std::snprintf(tag, sizeof(tag), ".%ld-%llu-%08llx.part", static_cast<long>(::getpid()),
                  static_cast<unsigned long long>(counter++),
                  static_cast<unsigned long long>(rng() & 0xffffffffULL));
    path_ = dest.parent_path() / ("." + dest.filename().string() + tag);
  }
  TempOutput(const TempOutput&) = delete;
  TempOutput& operator=(const TempOutput&) = delete;
  ~TempOutput() {
    if (committed_) return;
    std::error_code ec;
    fs::remove(path_, ec);  // nothing to report: the original error is already on its way
  }
  const fs::path& path() const { return path_; }
  void commit() { committed_ = true; }

 private:
  fs::path path_;
  bool committed_ = false;
};

}  // namespace

void encode_video_mp4(const std::string& path, const at::Tensor& frames, double fps, int crf,
                      int upscale) {
  VIDIT_CHECK(frames.defined() && frames.dim() == 4 && frames.size(3) == 3, "encode_video_mp4('",
              path, "'): frames must be [T, H, W, 3] RGB, got ",
              frames.defined() ? frames.sizes() : at::IntArrayRef{});
  VIDIT_CHECK(frames.scalar_type() == at::kByte, "encode_video_mp4('", path,
              "'): frames must be uint8 (0..255), got ", frames.scalar_type(),
              "; convert with (x * 255).round().clamp(0, 255).to(at::kByte)");
  VIDIT_CHECK(frames.size(0) > 0 && frames.size(1) > 0 && frames.size(2) > 0, "encode_video_mp4('",
              path, "'): frames must not be empty, got ", frames.sizes());
  VIDIT_CHECK(std::isfinite(fps) && fps > 0, "encode_video_mp4('", path,
              "'): fps must be a positive number, got ", fps);
  VIDIT_CHECK(crf >= 0 && crf <= 51, "encode_video_mp4('", path,
              "'): crf must be in [0, 51] (0 = lossless, 12 = near lossless, 23 = x264 default), "
              "got ", crf);
  VIDIT_CHECK(upscale >= 1 && upscale <= 64, "encode_video_mp4('", path,
              "'): upscale must be an integer factor in [1, 64], got ", upscale);
  VIDIT_CHECK(!path.empty(), "encode_video_mp4: the output path is empty");
  const fs::path dest(path);
  {
    std::error_code ec;
    const fs::path parent = dest.parent_path();
    VIDIT_CHECK(parent.empty() || fs::is_directory(parent, ec), "encode_video_mp4('", path,
                "'): the output directory '", parent.string(), "' does not exist; create it first");
    VIDIT_CHECK(!fs::is_directory(dest, ec), "encode_video_mp4('", path,
                "'): this is a directory; give the path of the .mp4 file to write");
  }
  const int64_t T = frames.size(0), H = frames.size(1), W = frames.size(2);
  VIDIT_CHECK(W * upscale <= 65536 && H * upscale <= 65536, "encode_video_mp4('", path, "'): ", W,
              "x", H, " frames upscaled ", upscale, "x would be ", W * upscale, "x", H * upscale,
              ", too large to encode; lower the upscale factor");
  const int out_w = static_cast<int>(W * upscale), out_h = static_cast<int>(H * upscale);
  quiet_ffmpeg_logs();

  // H.264 encoder: libx264 by name (FFmpeg's native h264 has no encoder; hardware ones differ).
  const AVCodec* codec = avcodec_find_encoder_by_name("libx264");
  VIDIT_CHECK(codec != nullptr, "encode_video_mp4('", path, "'): the FFmpeg libavcodec this "
              "program loaded (", av_version_info(), ") has no libx264 encoder. On Debian 12 the "
              "distribution's libavcodec59 (and libavcodec-extra59) are built with it: "
              "apt-get install libavcodec59 libx264-164; a libavcodec found first elsewhere "
              "(LD_LIBRARY_PATH, conda, a self-built FFmpeg) must be configured with "
              "--enable-gpl --enable-libx264");

  // Frame rate as a rational (30000/1001 for 29.97...); one tick of the codec clock per frame.
  const AVRational rate = av_d2q(fps, 1001000);
  VIDIT_CHECK(rate.num > 0 && rate.den > 0, "encode_video_mp4('", path, "'): fps ", fps,
              " has no usable rational form; use a frame rate such as 8, 24 or 29.97");

  TempOutput temp(dest);
  const std::string url = "file:" + temp.path().string();  // "file:": a colon is not a protocol

  // Muxer first, so that encoder flags can follow the container's needs.
  OutputPtr out;
  {
    AVFormatContext* raw = nullptr;
    const int ret = avformat_alloc_output_context2(&raw, nullptr, "mp4", url.c_str());
    VIDIT_CHECK(ret >= 0 && raw, "encode_video_mp4('", path,
                "'): libavformat cannot create an mp4 muxer: ",
                ret < 0 ? av_error_text(ret) : std::string("no context"),
                " (is this FFmpeg built without the mp4 muxer?)");
    out.reset(raw);
  }
  AVStream* stream = avformat_new_stream(out.get(), nullptr);
  VIDIT_CHECK(stream != nullptr, "encode_video_mp4('", path,
              "'): libavformat could not add a video stream (out of memory?)");

  CodecPtr enc(avcodec_alloc_context3(codec));
  VIDIT_CHECK(enc != nullptr, "encode_video_mp4('", path,
              "'): cannot allocate a libx264 encoder context (out of memory?)");
  enc->width = out_w;
  enc->height = out_h;
  enc->pix_fmt = AV_PIX_FMT_YUV444P;
  enc->time_base = av_inv_q(rate);
  enc->framerate = rate;
  enc->color_range = AVCOL_RANGE_MPEG;  // "tv" / limited range
  enc->colorspace = AVCOL_SPC_BT709;
  enc->color_primaries = AVCOL_PRI_BT709;
  enc->color_trc = AVCOL_TRC_BT709;
  enc->thread_count = 0;  // one per core, as the ffmpeg CLI chooses ("threads auto")
  if (out->oformat->flags & AVFMT_GLOBALHEADER) enc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  {
    Options opts;
    const std::string crf_text = std::to_string(crf);
    int ret = av_dict_set(&opts.dict, "preset", "medium", 0);
    if (ret >= 0) ret = av_dict_set(&opts.dict, "crf", crf_text.c_str(), 0);
    VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path, "'): cannot set encoder options: ",
                av_error_text(ret));
    ret = avcodec_open2(enc.get(), codec, &opts.dict);
    VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path, "'): libx264 refused ", out_w, "x", out_h,
                " yuv444p at crf ", crf, ": ", av_error_text(ret),
                " (FFmpeg's log above may say more)");
    const std::string unused = opts.leftovers();
    VIDIT_CHECK(unused.empty(), "encode_video_mp4('", path,
                "'): this libx264 wrapper does not know the options ", unused,
                "; a newer FFmpeg is needed");
  }
  {
    const int ret = avcodec_parameters_from_context(stream->codecpar, enc.get());
    VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path,
                "'): cannot copy encoder parameters to the stream: ", av_error_text(ret));
  }
  stream->time_base = enc->time_base;  // a hint: the muxer picks its own in write_header
  stream->avg_frame_rate = rate;

  // Converter: RGB24 (full range by nature) -> YUV444P with the BT.709 matrix and limited range,
  // nearest-neighbour resize to the output size, accurate rounding.
  SwsPtr sws(sws_getContext(static_cast<int>(W), static_cast<int>(H), AV_PIX_FMT_RGB24, out_w,
                            out_h, AV_PIX_FMT_YUV444P,
                            SWS_POINT | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT, nullptr, nullptr,
                            nullptr));
  VIDIT_CHECK(sws != nullptr, "encode_video_mp4('", path, "'): libswscale cannot convert ", W, "x",
              H, " RGB24 to ", out_w, "x", out_h, " yuv444p");
  {
    const int* bt709 = sws_getCoefficients(SWS_CS_ITU709);
    const int ret = sws_setColorspaceDetails(sws.get(), bt709, /*srcRange=*/1, bt709,
                                             /*dstRange (0 = tv)=*/0, 0, 1 << 16, 1 << 16);
    VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path,
                "'): libswscale refused the BT.709 limited-range conversion");
  }

  FramePtr frame(av_frame_alloc());
  PacketPtr packet(av_packet_alloc());
  VIDIT_CHECK(frame && packet, "encode_video_mp4('", path,
              "'): cannot allocate an FFmpeg frame or packet (out of memory?)");
  frame->format = AV_PIX_FMT_YUV444P;
  frame->width = out_w;
  frame->height = out_h;
  frame->color_range = enc->color_range;
  frame->colorspace = enc->colorspace;
  frame->color_primaries = enc->color_primaries;
  frame->color_trc = enc->color_trc;
  {
    const int ret = av_frame_get_buffer(frame.get(), 0);
    VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path, "'): cannot allocate a ", out_w, "x", out_h,
                " frame: ", av_error_text(ret), " (too large? lower the upscale factor)");
  }

  // Open the temporary file and write the header; faststart is the mp4 muxer's "movflags".
  if (!(out->oformat->flags & AVFMT_NOFILE)) {
    const int ret = avio_open(&out->pb, url.c_str(), AVIO_FLAG_WRITE);
    VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path, "'): cannot create the file '",
                temp.path().string(), "' in the output folder: ", av_error_text(ret),
                "; make the folder writable (permissions, free space, read-only mount) or "
                "choose another output path");
  }
  {
    Options opts;
    int ret = av_dict_set(&opts.dict, "movflags", "+faststart", 0);
    VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path, "'): cannot set muxer options: ",
                av_error_text(ret));
    ret = avformat_write_header(out.get(), &opts.dict);
    VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path, "'): writing the mp4 header to '",
                temp.path().string(), "' failed: ", av_error_text(ret));
    const std::string unused = opts.leftovers();
    VIDIT_CHECK(unused.empty(), "encode_video_mp4('", path,
                "'): this libavformat's mp4 muxer does not know the options ", unused,
                "; a newer FFmpeg is needed");
  }

  // Hands every packet the encoder has ready to the muxer. Each packet is one frame, so a packet
  // the encoder left without a duration lasts one tick (the muxer needs the last one's).
  auto drain = [&] {
    for (;;) {
      int ret = avcodec_receive_packet(enc.get(), packet.get());
      if (ret == AVERROR(EAGAIN) || ret == AVERROR_EOF) return;
      VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path, "'): libx264 failed: ", av_error_text(ret));
      if (packet->duration <= 0) packet->duration = 1;
      av_packet_rescale_ts(packet.get(), enc->time_base, stream->time_base);
      packet->stream_index = stream->index;
      ret = av_interleaved_write_frame(out.get(), packet.get());  // takes the packet's data
      VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path, "'): writing to '", temp.path().string(),
                  "' failed: ", av_error_text(ret), "; check free space on that filesystem");
    }
  };

  const at::Tensor data = frames.to(at::kCPU).contiguous();
  const auto* pixels = static_cast<const uint8_t*>(data.const_data_ptr());
  const int src_stride = static_cast<int>(W * 3);
  for (int64_t t = 0; t < T; ++t) {
    int ret = av_frame_make_writable(frame.get());  // the encoder may still hold the last one
    VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path, "'): cannot get a writable frame: ",
                av_error_text(ret));
    const uint8_t* src[4] = {pixels + t * H * W * 3, nullptr, nullptr, nullptr};
    const int src_strides[4] = {src_stride, 0, 0, 0};
    ret = sws_scale(sws.get(), src, src_strides, 0, static_cast<int>(H), frame->data,
                    frame->linesize);
    VIDIT_CHECK(ret == out_h, "encode_video_mp4('", path, "'): libswscale failed on frame ", t,
                ret < 0 ? ": " + av_error_text(ret) : std::string());
    frame->pts = t;
    ret = avcodec_send_frame(enc.get(), frame.get());
    VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path, "'): libx264 refused frame ", t, ": ",
                av_error_text(ret));
    drain();
  }
  {
    const int ret = avcodec_send_frame(enc.get(), nullptr);  // flush the frames held back
    VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path, "'): flushing libx264 failed: ",
                av_error_text(ret));
    drain();
  }

  // Trailer (with faststart the muxer moves the index to the front here), then close: a write
  // error that only shows when buffers are flushed is caught by the close.
  {
    int ret = av_write_trailer(out.get());
    VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path, "'): finishing the mp4 file '",
                temp.path().string(), "' failed: ", av_error_text(ret),
                "; check free space on that filesystem");
    if (!(out->oformat->flags & AVFMT_NOFILE)) {
      ret = avio_closep(&out->pb);
      VIDIT_CHECK(ret >= 0, "encode_video_mp4('", path, "'): closing '", temp.path().string(),
                  "' failed: ", av_error_text(ret), "; check free space on that filesystem");
    }
  }
  out.reset();

  std::error_code ec;
  fs::rename(temp.path(), dest, ec);
  VIDIT_CHECK(!ec, "encode_video_mp4('", path, "'): cannot move the finished file '",
              temp.path().string(), "' to its name: ", ec.message());
  temp.commit();
}

}  // namespace vidit

// Image files -> uint8 RGB (see image_file.h): libavformat + libavcodec decode one frame; 8-bit
// Y'CbCr is converted the way libjpeg converts it, anything else by libswscale.
#include "vision/image_file.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "vision/jpeg_file.h"

#ifdef VIDIT_HAVE_FFMPEG
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/dict.h>
#include <libavutil/display.h>
#include <libavutil/frame.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

#include "video/ffmpeg_handles.h"
#endif

namespace vidit::vision {

#ifndef VIDIT_HAVE_FFMPEG

bool image_decoding_available() { return false; }

at::Tensor decode_image_file(const std::string& path) {
  if (std::optional<at::Tensor> jpeg = decode_jpeg_like_pil(path)) return *jpeg;
  fail("cannot decode image file '", path, "': this vidit build has no FFmpeg support (the FFmpeg development "
       "libraries were not found at configure time). Install them (Debian/Ubuntu: apt-get install libavformat-dev "
       "libavcodec-dev libavutil-dev libswscale-dev pkg-config) and reconfigure the build, or decode the picture "
       "elsewhere and pass its pixels (uint8 [H, W, 3]) to preprocess_clip_image");
}

#else

namespace {

std::string av_error_text(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  if (av_strerror(err, buf, sizeof(buf)) < 0) std::snprintf(buf, sizeof(buf), "FFmpeg error %d", err);
  return buf;
}

struct FormatCloser {
  void operator()(AVFormatContext* c) const { avformat_close_input(&c); }
};
using FormatPtr = std::unique_ptr<AVFormatContext, FormatCloser>;

// FFmpeg's INFO-level chatter stays out of training logs; errors still print. A level the
// application set is kept.
void quiet_ffmpeg_logs() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (av_log_get_level() == AV_LOG_INFO) av_log_set_level(AV_LOG_ERROR);
  });
}

// A picture of 8-bit planes Y, Cb, Cr (then maybe alpha), chroma subsampled by 1 or 2 each way:
// what this file converts itself.
bool is_planar_ycbcr8(const AVFrame* f) {
  const AVPixFmtDescriptor* d = av_pix_fmt_desc_get(static_cast<AVPixelFormat>(f->format));
  if (!d || (d->flags & (AV_PIX_FMT_FLAG_RGB | AV_PIX_FMT_FLAG_PAL | AV_PIX_FMT_FLAG_BAYER | AV_PIX_FMT_FLAG_FLOAT)) ||
      !(d->flags & AV_PIX_FMT_FLAG_PLANAR) || d->nb_components < 3 || d->log2_chroma_w > 1 || d->log2_chroma_h > 1)
    return false;
  for (int i = 0; i < 3; ++i)
    if (d->comp[i].depth != 8 || d->comp[i].plane != i || d->comp[i].step != 1 || d->comp[i].shift != 0) return false;
  return true;
}

bool is_full_range(const AVFrame* f) {
  switch (f->format) {
    case AV_PIX_FMT_YUVJ420P:
    case AV_PIX_FMT_YUVJ422P:
    case AV_PIX_FMT_YUVJ444P:
    case AV_PIX_FMT_YUVJ440P:
      return true;
    default:
      return f->color_range == AVCOL_RANGE_JPEG;
  }
}

// One chroma plane brought to full resolution the way libjpeg(-turbo) does it by default ("fancy"
// upsampling): chroma samples sit between the luma samples they cover, and each output sample is
// 3/4 of the nearer chroma sample plus 1/4 of the farther one along each doubled axis (9/16,
// 3/16, 3/16, 1/16 in 2-D), samples beyond the edge repeating the edge. libjpeg's integer rounding
// (biases alternating between neighbouring outputs) is kept, since it decides the last bit. Where a
// horizontally halved plane is at most 2 samples wide, libjpeg repeats samples instead; so does
// this. Returns rows of `out_w` samples, `out_h` rows (the picture's size: odd sizes drop the
// last upsampled row or column).
std::vector<uint8_t> upsample_chroma(const uint8_t* src, int stride, int cw, int ch, int sx, int sy, int out_w,
                                     int out_h) {
  std::vector<uint8_t> out(static_cast<size_t>(out_w) * out_h);
  auto sample = [&](int r, int c) -> int {
    return src[static_cast<size_t>(std::clamp(r, 0, ch - 1)) * stride + std::clamp(c, 0, cw - 1)];
  };
  const bool fancy_h = sx == 2 && cw > 2;
  for (int y = 0; y < out_h; ++y) {
    const int r = sy == 2 ? y >> 1 : y;                         // the chroma row holding this output row
    const int nb = sy == 2 ? (y % 2 == 0 ? r - 1 : r + 1) : r;  // the farther row (above for even rows)
    uint8_t* dst = &out[static_cast<size_t>(y) * out_w];
    if (sx == 1) {
      for (int x = 0; x < out_w; ++x) {
        dst[x] = sy == 2 ? static_cast<uint8_t>((3 * sample(r, x) + sample(nb, x) + (y % 2 == 0 ? 1 : 2)) >> 2)
                         : static_cast<uint8_t>(sample(r, x));
      }
      continue;
    }
    for (int x = 0; x < out_w; ++x) {
      const int c = x >> 1;
      const int far = x % 2 == 0 ? c - 1 : c + 1;  // the farther column (left for even columns)
      if (!fancy_h) {  // repeat horizontally, and vertically too (libjpeg's plain upsampling)
        dst[x] = static_cast<uint8_t>(sample(r, c));
        continue;
      }
      if (sy == 2) {  // column sums of 3 x the nearer row + the farther row, then 3:1 across
        const int near_sum = 3 * sample(r, c) + sample(nb, c);
        const int far_sum = 3 * sample(r, far) + sample(nb, far);
        dst[x] = static_cast<uint8_t>((3 * near_sum + far_sum + (x % 2 == 0 ? 8 : 7)) >> 4);
      } else {
        dst[x] = static_cast<uint8_t>((3 * sample(r, c) + sample(r, far) + (x % 2 == 0 ? 1 : 2)) >> 2);
      }
    }
  }
  return out;
}

// libjpeg's integer tables for full-range BT.601 Y'CbCr -> RGB (JFIF): 16 fractional bits,
// constants rounded to that precision, red and blue offsets rounded per table entry, green's sum
// rounded once.
struct JfifTables {
  int cr_r[256], cb_b[256];
  int32_t cr_g[256], cb_g[256];
  JfifTables() {
    constexpr int kBits = 16;
    constexpr int32_t kHalf = int32_t{1} << (kBits - 1);
    auto fix = [](double v) { return static_cast<int32_t>(v * (1 << kBits) + 0.5); };
    for (int i = 0; i < 256; ++i) {
      const int32_t x = i - 128;
      cr_r[i] = static_cast<int>((fix(1.40200) * x + kHalf) >> kBits);
      cb_b[i] = static_cast<int>((fix(1.77200) * x + kHalf) >> kBits);
      cr_g[i] = -fix(0.71414) * x;
      cb_g[i] = -fix(0.34414) * x + kHalf;
    }
  }
};

inline uint8_t clip255(int v) { return static_cast<uint8_t>(std::clamp(v, 0, 255)); }

// The luma weights (Kr, Kb) of a colour matrix; BT.601's when the file does not say.
std::pair<double, double> luma_weights(int colorspace) {
  switch (colorspace) {
    case AVCOL_SPC_BT709: return {0.2126, 0.0722};
    case AVCOL_SPC_BT2020_NCL:
    case AVCOL_SPC_BT2020_CL: return {0.2627, 0.0593};
    case AVCOL_SPC_SMPTE240M: return {0.212, 0.087};
    case AVCOL_SPC_FCC: return {0.30, 0.11};
    default: return {0.299, 0.114};
  }
}

at::Tensor ycbcr_to_rgb(const AVFrame* f) {
  const AVPixFmtDescriptor* d = av_pix_fmt_desc_get(static_cast<AVPixelFormat>(f->format));
  const int W = f->width, H = f->height;
  const int sx = 1 << d->log2_chroma_w, sy = 1 << d->log2_chroma_h;
  const int cw = -((-W) >> d->log2_chroma_w), ch = -((-H) >> d->log2_chroma_h);  // rounded up
  const std::vector<uint8_t> cb = upsample_chroma(f->data[1], f->linesize[1], cw, ch, sx, sy, W, H);
  const std::vector<uint8_t> cr = upsample_chroma(f->data[2], f->linesize[2], cw, ch, sx, sy, W, H);
  at::Tensor out = at::empty({H, W, 3}, at::kByte);
  uint8_t* rgb = out.data_ptr<uint8_t>();
  const bool full = is_full_range(f);
  const bool jfif = full && (f->colorspace == AVCOL_SPC_UNSPECIFIED || f->colorspace == AVCOL_SPC_BT470BG ||
                             f->colorspace == AVCOL_SPC_SMPTE170M);
  static const JfifTables t;
  const auto [kr, kb] = luma_weights(f->colorspace);
  const double kg = 1.0 - kr - kb;
  const double y_scale = full ? 1.0 : 255.0 / 219.0, c_scale = full ? 1.0 : 255.0 / 224.0;
  const double y_offset = full ? 0.0 : 16.0;
  for (int y = 0; y < H; ++y) {
    const uint8_t* Y = f->data[0] + static_cast<size_t>(y) * f->linesize[0];
    const uint8_t* Cb = &cb[static_cast<size_t>(y) * W];
    const uint8_t* Cr = &cr[static_cast<size_t>(y) * W];
    uint8_t* o = rgb + static_cast<size_t>(y) * W * 3;
    for (int x = 0; x < W; ++x, o += 3) {
      if (jfif) {
        const int l = Y[x];
        o[0] = clip255(l + t.cr_r[Cr[x]]);
        o[1] = clip255(l + static_cast<int>((t.cb_g[Cb[x]] + t.cr_g[Cr[x]]) >> 16));
        o[2] = clip255(l + t.cb_b[Cb[x]]);
      } else {
        const double l = (Y[x] - y_offset) * y_scale;
        const double u = (Cb[x] - 128.0) * c_scale, v = (Cr[x] - 128.0) * c_scale;
        o[0] = clip255(static_cast<int>(std::lround(l + 2.0 * (1.0 - kr) * v)));
        o[1] = clip255(static_cast<int>(std::lround(l - 2.0 * kb * (1.0 - kb) / kg * u - 2.0 * kr * (1.0 - kr) / kg * v)));
        o[2] = clip255(static_cast<int>(std::lround(l + 2.0 * (1.0 - kb) * u)));
      }
    }
  }
  return out;
}

// Everything else through libswscale (the conversion the ffmpeg CLI makes for -pix_fmt rgb24).
at::Tensor swscale_to_rgb(const AVFrame* f, const std::string& path) {
  const char* name = av_get_pix_fmt_name(static_cast<AVPixelFormat>(f->format));
  ffmpeg::SwsPtr sws(sws_getContext(f->width, f->height, static_cast<AVPixelFormat>(f->format), f->width, f->height,
                                    AV_PIX_FMT_RGB24, SWS_BICUBIC, nullptr, nullptr, nullptr));
  VIDIT_CHECK(sws, "image '", path, "': libswscale cannot convert ", name ? name : "its pixel format",
              " pictures to RGB; save the picture as 8-bit RGB PNG or JPEG");
  const AVPixFmtDescriptor* d = av_pix_fmt_desc_get(static_cast<AVPixelFormat>(f->format));
  if (d && !(d->flags & AV_PIX_FMT_FLAG_RGB) && d->nb_components >= 3) {  // Y'CbCr of other depths
    int *inv_table = nullptr, *table = nullptr;
    int src_full = 0, dst_full = 0, brightness = 0, contrast = 0, saturation = 0;
    if (sws_getColorspaceDetails(sws.get(), &inv_table, &src_full, &table, &dst_full, &brightness, &contrast,
                                 &saturation) >= 0) {
      const int* coeffs = sws_getCoefficients(f->colorspace);
      sws_setColorspaceDetails(sws.get(), coeffs, is_full_range(f) ? 1 : 0, coeffs, dst_full, brightness, contrast,
                               saturation);
    }
  }
  ffmpeg::FramePtr rgb(av_frame_alloc());
  VIDIT_CHECK(rgb, "image '", path, "': out of memory");
  rgb->format = AV_PIX_FMT_RGB24;
  rgb->width = f->width;
  rgb->height = f->height;
  int ret = av_frame_get_buffer(rgb.get(), 0);
  VIDIT_CHECK(ret >= 0, "image '", path, "': allocating a ", f->width, "x", f->height, " RGB picture failed: ",
              av_error_text(ret));
  ret = sws_scale(sws.get(), f->data, f->linesize, 0, f->height, rgb->data, rgb->linesize);
  VIDIT_CHECK(ret > 0, "image '", path, "': converting the picture to RGB failed",
              ret < 0 ? ": " + av_error_text(ret) : std::string());
  at::Tensor out = at::empty({f->height, f->width, 3}, at::kByte);
  const size_t row = static_cast<size_t>(f->width) * 3;
  for (int y = 0; y < f->height; ++y)
    std::memcpy(out.data_ptr<uint8_t>() + y * row, rgb->data[0] + static_cast<size_t>(y) * rgb->linesize[0], row);
  return out;
}

// The picture's EXIF orientation (1..8, 1: as stored). FFmpeg's JPEG decoder exports it as the
// frame's "Orientation" tag; where that is absent, a display matrix without mirroring gives the
// quarter turns (orientations 3, 6, 8).
int exif_orientation(const AVFrame* f) {
  if (const AVDictionaryEntry* e = av_dict_get(f->metadata, "Orientation", nullptr, 0); e && e->value) {
    const long v = std::strtol(e->value, nullptr, 10);  // the value may start with spaces
    if (v >= 1 && v <= 8) return static_cast<int>(v);
  }
  const AVFrameSideData* sd = av_frame_get_side_data(f, AV_FRAME_DATA_DISPLAYMATRIX);
  if (!sd || sd->size < 9 * sizeof(int32_t)) return 1;
  const auto* m = reinterpret_cast<const int32_t*>(sd->data);
  if (static_cast<double>(m[0]) * m[4] - static_cast<double>(m[1]) * m[3] <= 0) return 1;  // mirrored: not read
  const double ccw = av_display_rotation_get(m);  // degrees counter-clockwise
  if (!std::isfinite(ccw)) return 1;
  const long quarter = std::lround(ccw / 90.0) % 4;
  return quarter == -1 || quarter == 3 ? 6 : quarter == 1 || quarter == -3 ? 8 : quarter == 2 || quarter == -2 ? 3 : 1;
}

}  // namespace

bool image_decoding_available() { return true; }

at::Tensor decode_image_file(const std::string& path) {
  std::error_code ec;
  VIDIT_CHECK(std::filesystem::is_regular_file(path, ec), "image '", path, "' does not exist or is not a file");
  // JPEGs through libjpeg as PIL decodes them (jpeg_file.h): the same pixels, not within 3 levels.
  if (std::optional<at::Tensor> jpeg = decode_jpeg_like_pil(path)) return *jpeg;
  quiet_ffmpeg_logs();
  AVFormatContext* raw = nullptr;
  int ret = avformat_open_input(&raw, path.c_str(), nullptr, nullptr);
  VIDIT_CHECK(ret >= 0, "image '", path, "': FFmpeg cannot read it as a picture (", av_error_text(ret),
              "); use PNG, JPEG or WebP");
  FormatPtr fmt(raw);
  ret = avformat_find_stream_info(fmt.get(), nullptr);
  VIDIT_CHECK(ret >= 0, "image '", path, "': FFmpeg cannot read it as a picture (", av_error_text(ret), ")");
  const int index = av_find_best_stream(fmt.get(), AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
  VIDIT_CHECK(index >= 0, "image '", path, "' holds no picture (FFmpeg finds no image or video stream in it)");
  const AVCodecParameters* par = fmt->streams[index]->codecpar;
  const AVCodec* codec = avcodec_find_decoder(par->codec_id);
  VIDIT_CHECK(codec, "image '", path, "': this FFmpeg has no decoder for ", avcodec_get_name(par->codec_id),
              "; convert the picture to PNG or JPEG");
  ffmpeg::CodecPtr ctx(avcodec_alloc_context3(codec));
  VIDIT_CHECK(ctx, "image '", path, "': out of memory");
  ret = avcodec_parameters_to_context(ctx.get(), par);
  VIDIT_CHECK(ret >= 0, "image '", path, "': ", av_error_text(ret));
  ctx->thread_count = 1;
  ret = avcodec_open2(ctx.get(), codec, nullptr);
  VIDIT_CHECK(ret >= 0, "image '", path, "': cannot open the ", avcodec_get_name(par->codec_id), " decoder (",
              av_error_text(ret), ")");
  ffmpeg::PacketPtr pkt(av_packet_alloc());
  ffmpeg::FramePtr frame(av_frame_alloc());
  VIDIT_CHECK(pkt && frame, "image '", path, "': out of memory");
  // Packets until the decoder gives a frame; damaged packets are skipped, the way the ffmpeg CLI
  // skips them. At the end, what the decoder still holds.
  int last_error = 0;
  bool got = false;
  while (!got && av_read_frame(fmt.get(), pkt.get()) >= 0) {
    if (pkt->stream_index == index) {
      ret = avcodec_send_packet(ctx.get(), pkt.get());
      if (ret < 0 && ret != AVERROR(EAGAIN)) last_error = ret;
      ret = avcodec_receive_frame(ctx.get(), frame.get());
      if (ret == 0) got = true;
      else if (ret != AVERROR(EAGAIN)) last_error = ret;
    }
    av_packet_unref(pkt.get());
  }
  if (!got) {
    avcodec_send_packet(ctx.get(), nullptr);
    got = avcodec_receive_frame(ctx.get(), frame.get()) == 0;
  }
  VIDIT_CHECK(got, "image '", path, "': no picture could be decoded",
              last_error ? " (" + av_error_text(last_error) + ")" : std::string(), "; the file is damaged or empty");
  VIDIT_CHECK(frame->width > 0 && frame->height > 0, "image '", path, "': the decoder returned an empty picture");
  const at::Tensor rgb = is_planar_ycbcr8(frame.get()) ? ycbcr_to_rgb(frame.get()) : swscale_to_rgb(frame.get(), path);
  return apply_exif_orientation(rgb, exif_orientation(frame.get()));
}

#endif  // VIDIT_HAVE_FFMPEG

}  // namespace vidit::vision

// NVDEC through FFmpeg's cuda hwaccel (see decode_nvdec.h). Compiled in FFmpeg builds only: the
// glob in CMakeLists.txt takes every src/*.cpp, so the body sits under VIDIT_HAVE_FFMPEG.
#if defined(VIDIT_HAVE_FFMPEG)
#include "video/decode_nvdec.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "core/error.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavutil/buffer.h>
#include <libavutil/frame.h>
#include <libavutil/hwcontext.h>
}

namespace vidit::nvdec {

namespace {

std::string error_text(int err) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  if (av_strerror(err, buf, sizeof(buf)) < 0) std::snprintf(buf, sizeof(buf), "FFmpeg error %d", err);
  return buf;
}

AVPixelFormat pick_format(AVCodecContext* dec, const AVPixelFormat* offered) {
  auto* session = static_cast<Session*>(dec->opaque);
  for (const AVPixelFormat* p = offered; *p != AV_PIX_FMT_NONE; ++p)
    if (*p == AV_PIX_FMT_CUDA) return *p;
  // libavcodec calls again without CUDA when the hwaccel refused the stream (e.g. a profile or
  // size the GPU's decoder lacks).
  session->refused = true;
  if (session->strict) return AV_PIX_FMT_NONE;
  return avcodec_default_get_format(dec, offered);
}

}  // namespace

int resolve_device_index(int requested) {
  if (requested >= 0) return requested;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible && *visible && !std::strchr(visible, ',')) return 0;  // one GPU visible: it is 0
  if (const char* local = std::getenv("LOCAL_RANK"); local && *local) {
    char* end = nullptr;
    const long v = std::strtol(local, &end, 10);
    if (end && *end == '\0' && v >= 0 && v < 1024) return static_cast<int>(v);
  }
  return 0;
}

AVBufferRef* cuda_device(int index, std::string* why) {
  struct Entry {
    AVBufferRef* device = nullptr;
    std::string why;
  };
  static std::mutex mu;
  static std::map<int, Entry>* devices = new std::map<int, Entry>;  // lives for the process
  std::lock_guard<std::mutex> lock(mu);
  auto it = devices->find(index);
  if (it == devices->end()) {
    Entry e;
    if (av_hwdevice_find_type_by_name("cuda") == AV_HWDEVICE_TYPE_NONE) {
      e.why = "this FFmpeg build has no CUDA support";
    } else {
      // Without a driver FFmpeg logs "Cannot load libcuda.so.1" at error level; the reason
      // goes into our one fallback line instead. (Other threads' messages are muted only for the
      // duration of this one-time call.)
      const int level = av_log_get_level();
      av_log_set_level(AV_LOG_QUIET);
      const std::string name = std::to_string(index);
      const int ret = av_hwdevice_ctx_create(&e.device, AV_HWDEVICE_TYPE_CUDA, name.c_str(), nullptr, 0);
      av_log_set_level(level);
      if (ret < 0) {
        e.device = nullptr;
        e.why = "cannot open CUDA device " + name + ": " + error_text(ret) +
                " (no NVIDIA driver (libcuda.so.1), no GPU, or no GPU with that index)";
      }
    }
    it = devices->emplace(index, std::move(e)).first;
  }
  if (!it->second.device && why) *why = it->second.why;
  return it->second.device;
}

const AVCodec* find_decoder(int codec_id) {
  void* iter = nullptr;
  while (const AVCodec* c = av_codec_iterate(&iter)) {
    if (c->id != codec_id || !av_codec_is_decoder(c) || (c->capabilities & AV_CODEC_CAP_HARDWARE))
      continue;  // AV_CODEC_CAP_HARDWARE: wrappers such as h264_cuvid, not the hwaccel
    for (int i = 0;; ++i) {
      const AVCodecHWConfig* cfg = avcodec_get_hw_config(c, i);
      if (!cfg) break;
      if (cfg->device_type == AV_HWDEVICE_TYPE_CUDA &&
          (cfg->methods & AV_CODEC_HW_CONFIG_METHOD_HW_DEVICE_CTX))
        return c;
    }
  }
  return nullptr;
}

void attach(AVCodecContext* dec, AVBufferRef* device, Session* session, const std::string& path) {
  dec->hw_device_ctx = av_buffer_ref(device);
  VIDIT_CHECK(dec->hw_device_ctx, "video file '", path, "': out of memory referencing the CUDA device");
  dec->opaque = session;
  dec->get_format = pick_format;
  dec->thread_count = 1;
  dec->extra_hw_frames = 2;
}

const AVFrame* to_host(const AVFrame* f, AVFrame* host, const std::string& path) {
  if (f->format != AV_PIX_FMT_CUDA) return f;
  av_frame_unref(host);
  int ret = av_hwframe_transfer_data(host, f, 0);
  VIDIT_CHECK(ret >= 0, "video file '", path, "': downloading an NVDEC frame from the GPU failed: ",
              error_text(ret));
  ret = av_frame_copy_props(host, f);
  VIDIT_CHECK(ret >= 0, "video file '", path, "': copying NVDEC frame properties failed: ",
              error_text(ret));
  return host;
}

void log_software_fallback(const std::string& why) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::fprintf(stderr,
                 "vidit: NVDEC unavailable (%s); video decode device=auto uses software decoding "
                 "(logged once per process)\n",
                 why.c_str());
    std::fflush(stderr);
  });
}

}  // namespace vidit::nvdec

#endif  // VIDIT_HAVE_FFMPEG

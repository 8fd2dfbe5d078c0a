// NVDEC for decode_video, through FFmpeg's `cuda` hwaccel: libavcodec's own parser and decoder
// drive the GPU's decoder (AVCodecContext::hw_device_ctx with an AV_HWDEVICE_TYPE_CUDA device),
// and frames that reach the output are downloaded to host memory with av_hwframe_transfer_data
// (NV12, P010, ... depending on the stream), then converted to RGB like software frames. Frames
// that the clip drops are never downloaded.
//
// Internal to src/data (FFmpeg types); compiled only in FFmpeg builds. Thread safety: the CUDA
// device is created once per GPU index and process, under a lock, and shared by every decoder
// (FFmpeg device contexts are reference-counted and may be shared); everything else is per
// decoder.
#pragma once
#include <string>

struct AVBufferRef;
struct AVCodec;
struct AVCodecContext;
struct AVFrame;

namespace vidit::nvdec {

// The CUDA device index DecodeOptions::cuda_device == `requested` names (-1: LOCAL_RANK unless
// CUDA_VISIBLE_DEVICES narrows the process to one GPU, else 0).
int resolve_device_index(int requested);

// The process-wide FFmpeg CUDA device context for GPU `index`, created on first use and kept for
// the process's lifetime (callers av_buffer_ref it, never unref this pointer). nullptr when there
// is none, with `why` saying why (no driver, no such GPU, FFmpeg built without CUDA). A failure is
// remembered: later calls answer at once.
AVBufferRef* cuda_device(int index, std::string* why);

// A libavcodec decoder for `codec_id` (an AVCodecID) with the cuda hwaccel, or nullptr. Only
// hwaccel decoders qualify (not the *_cuvid wrappers).
const AVCodec* find_decoder(int codec_id);

// Per-decoder state read by the get_format callback; AVCodecContext::opaque points at it, so it
// must outlive the decoder.
struct Session {
  bool strict = false;   // true (device=nvdec): a stream NVDEC refuses fails instead of
                         // continuing in software
  bool refused = false;  // set when libavcodec offered no CUDA format (profile NVDEC cannot do)
};

// Sets up the unopened decoder `dec` to decode on `device`: hw_device_ctx, a get_format that
// picks CUDA frames, one thread (NVDEC does the work), two extra hardware frames for the one the
// clip holds. Throws vidit::Error naming `path` on failure.
void attach(AVCodecContext* dec, AVBufferRef* device, Session* session, const std::string& path);

// `f` itself when its pixels are in host memory; otherwise downloads it into `host` (which is
// unreffed first) with its properties (timestamps, colour, aspect) and returns `host`.
// Throws vidit::Error naming `path` on failure.
const AVFrame* to_host(const AVFrame* f, AVFrame* host, const std::string& path);

// Prints, once per process, one line to stderr saying that device=auto decodes in software
// and why.
void log_software_fallback(const std::string& why);

}  // namespace vidit::nvdec

// JPEG pictures decoded by libjpeg(-turbo), the library PIL decodes them with, with PIL's
// settings (its default integer inverse DCT, "fancy" chroma upsampling, libjpeg's own Y'CbCr to
// RGB), so that the pixels equal diffusers' load_image (PIL's Image.open, exif_transpose,
// convert("RGB")) rather than coming within a few levels as another decoder's would:
//  - Y'CbCr and RGB JPEGs come out as RGB, greyscale ones repeated into R, G and B, CMYK and YCCK
//    ones (Adobe's inverted samples, as PIL assumes) converted to RGB by PIL's integer formula;
//  - the EXIF orientation in the APP1 segment (IFD0's tag 0x0112) is applied, all 8 of them;
// Builds without libjpeg return no picture for every file (image_file.h then decodes JPEGs with
// FFmpeg, within 3 levels of PIL). Thread safety: calls may run concurrently.
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <string>

namespace vidit::vision {

// True in builds with libjpeg.
bool jpeg_decoding_available();

// The picture in `path` as uint8 [H, W, 3] RGB when it is a JPEG
// (see above); std::nullopt when the file does not start with a JPEG marker or the build has no
// libjpeg. Throws vidit::Error naming `path` when a JPEG is damaged.
std::optional<at::Tensor> decode_jpeg_like_pil(const std::string& path);

// The EXIF orientation (1..8; 1 when absent or unreadable) of an APP1 segment's payload (what
// follows the marker and length: "Exif\0\0", then a TIFF header and IFD0).
int exif_orientation_of(const uint8_t* data, size_t size);

// `rgb` [H, W, 3] stored with EXIF `orientation`, brought upright as PIL's exif_transpose does.
at::Tensor apply_exif_orientation(const at::Tensor& rgb, int orientation);

}  // namespace vidit::vision

// Image files -> uint8 RGB tensors, with FFmpeg's libraries (libavformat reads a picture file as a
// one-frame video), giving the pixels diffusers' load_image gives (PIL: Image.open, then
// ImageOps.exif_transpose, then convert("RGB")), the picture an image-to-video pipeline hands to
// both the CLIP image processor and the VAE:
//  - greyscale is repeated into R, G and B; an alpha channel is dropped, not composited (handed an
//    RGBA picture directly, transformers' image processor would composite it on white; pipelines
//    hand it RGB); a palette is looked up;
//  - the EXIF orientation a JPEG carries is applied (all 8, mirrored ones included, through the
//    "Orientation" tag FFmpeg's JPEG decoder exports; where only a display matrix is exported,
//    its quarter turns). Orientation stored in PNG or WebP metadata is not read;
//  - JPEGs (CMYK ones too) are decoded by libjpeg with PIL's settings (vision/jpeg_file.h): the
//    same pixels as PIL. Without libjpeg in the build FFmpeg decodes them as below;
//  - 8-bit Y'CbCr pictures FFmpeg decodes (lossy WebP; JPEG without libjpeg) are converted here
//    rather than by libswscale, which places subsampled chroma differently (off by up to 160
//    levels from PIL at colour edges, on ffmpeg-made 4:2:0 JPEGs): chroma is upsampled by
//    libjpeg's "fancy" triangle filter (centred samples, 3/4 of the nearer and 1/4 of the farther
//    one along each halved axis, with its integer rounding), and full-range BT.601 (JPEG's JFIF)
//    is converted with libjpeg's own integer tables, so that only the decoders' inverse DCTs
//    differ: FFmpeg-decoded JPEGs come within 3 levels of PIL 13 (libjpeg-turbo), more than 1 on
//    under 0.3% of values. Other Y'CbCr (limited range, BT.709, ...) is converted in floating
//    point after the same upsampling; lossy WebP, which PIL's libwebp converts with its own
//    rounding, comes out within 3 levels (more than 1 on 1.1% of values);
//  - every other format (RGB, RGBA, grey, palette; PNG, lossless WebP, BMP, TIFF, GIF) goes
//    through libswscale to RGB24, which copies 8-bit RGB and grey exactly; 16-bit samples are
//    scaled to 8 bits.
// The first frame of an animation (or video) is used.
//
// Builds without FFmpeg throw from decode_image_file and report false from
// image_decoding_available(). Thread safety: calls may run concurrently (each owns its FFmpeg
// contexts).
#pragma once
#include <ATen/ATen.h>

#include <string>

namespace vidit::vision {

// False in builds without FFmpeg, where decode_image_file always throws.
bool image_decoding_available();

// The picture in `path` as uint8 [H, W, 3] RGB, contiguous, on the CPU. Throws vidit::Error naming
// the file when it is missing, is not a picture FFmpeg can read (not a media file, no video
// stream, no decoder), or yields no frame.
at::Tensor decode_image_file(const std::string& path);

}  // namespace vidit::vision

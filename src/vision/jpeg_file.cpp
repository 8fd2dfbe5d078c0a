// JPEG files through libjpeg with PIL's settings, and EXIF orientation (see jpeg_file.h).
#include "vision/jpeg_file.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/error.h"

#ifdef VIDIT_HAVE_LIBJPEG
extern "C" {
#include <jpeglib.h>
#include <jerror.h>
}
#endif

namespace vidit::vision {

int exif_orientation_of(const uint8_t* data, size_t size) {
  if (size < 6 + 8 || std::memcmp(data, "Exif\0\0", 6) != 0) return 1;
  const uint8_t* tiff = data + 6;
  const size_t n = size - 6;
  const bool little = tiff[0] == 'I' && tiff[1] == 'I';
  if (!little && !(tiff[0] == 'M' && tiff[1] == 'M')) return 1;
  auto u16 = [&](size_t at) -> uint32_t {
    return little ? tiff[at] | tiff[at + 1] << 8 : tiff[at] << 8 | tiff[at + 1];
  };
  auto u32 = [&](size_t at) -> uint32_t {
    return little ? u16(at) | u16(at + 2) << 16 : u16(at) << 16 | u16(at + 2);
  };
  if (u16(2) != 42) return 1;
  const size_t ifd = u32(4);
  if (ifd + 2 > n) return 1;
  const uint32_t entries = u16(ifd);
  for (uint32_t i = 0; i < entries; ++i) {
    const size_t e = ifd + 2 + 12 * size_t(i);
    if (e + 12 > n) return 1;
    if (u16(e) != 0x0112) continue;
    const uint32_t type = u16(e + 2), value = type == 3 ? u16(e + 8) : type == 4 ? u32(e + 8) : 0;
    return value >= 1 && value <= 8 ? int(value) : 1;
  }
  return 1;
}

at::Tensor apply_exif_orientation(const at::Tensor& rgb, int orientation) {
  switch (orientation) {
    case 2: return rgb.flip({1}).contiguous();                     // mirrored left-right
    case 3: return rgb.flip({0, 1}).contiguous();                  // half a turn
    case 4: return rgb.flip({0}).contiguous();                     // mirrored top-bottom
    case 5: return rgb.transpose(0, 1).contiguous();               // mirrored about the main diagonal
    case 6: return rgb.transpose(0, 1).flip({1}).contiguous();     // a quarter turn clockwise
    case 7: return rgb.transpose(0, 1).flip({0, 1}).contiguous();  // mirrored about the other diagonal
    case 8: return rgb.transpose(0, 1).flip({0}).contiguous();     // a quarter turn counter-clockwise
    default: return rgb;
  }
}

#ifndef VIDIT_HAVE_LIBJPEG

bool jpeg_decoding_available() { return false; }
std::optional<at::Tensor> decode_jpeg_like_pil(const std::string&) { return std::nullopt; }

#else

namespace {

// libjpeg reports a fatal error by calling error_exit, which must not return: it jumps back to
// the setjmp of the call in progress (read_header or read_pixels, whose locals are all trivial),
// with the message kept. A premature end of data is only a warning to libjpeg (it pads with
// grey); PIL refuses such a file, and so does this reader.
struct ErrorState {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
};

[[noreturn]] void on_error(j_common_ptr c) {
  auto* e = reinterpret_cast<ErrorState*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

void on_message(j_common_ptr c, int level) {
  auto* e = reinterpret_cast<ErrorState*>(c->err);
  if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) e->truncated = true;  // warnings are otherwise quiet
}

struct Decoder {
  jpeg_decompress_struct cinfo;
  ErrorState err;
  bool created = false;
  Decoder() {
    std::memset(&cinfo, 0, sizeof cinfo);
    std::memset(&err, 0, sizeof err);
  }
  ~Decoder() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

// CMYK as PIL reads a JPEG's (Adobe's inverted samples: "CMYK;I") and converts it to RGB: with
// n = 255 - K, each of R, G, B is n - C * n / 255, the division rounded as PIL's MULDIV255.
at::Tensor cmyk_to_rgb(const at::Tensor& stored) {
  const int64_t pixels = stored.size(0) * stored.size(1);
  at::Tensor rgb = at::empty({stored.size(0), stored.size(1), 3}, at::kByte);
  const uint8_t* in = stored.data_ptr<uint8_t>();
  uint8_t* out = rgb.data_ptr<uint8_t>();
  for (int64_t i = 0; i < pixels; ++i, in += 4, out += 3) {
    const int n = in[3];  // inverted K: 255 - K
    for (int ch = 0; ch < 3; ++ch) {
      const int t = (255 - in[ch]) * n + 128;
      out[ch] = static_cast<uint8_t>(std::clamp(n - (((t >> 8) + t) >> 8), 0, 255));
    }
  }
  return rgb;
}

bool read_header(Decoder& d, const uint8_t* data, size_t size) {
  d.cinfo.err = jpeg_std_error(&d.err.mgr);
  d.err.mgr.error_exit = on_error;
  d.err.mgr.emit_message = on_message;
  if (setjmp(d.err.jump)) return false;
  jpeg_create_decompress(&d.cinfo);
  d.created = true;
  jpeg_mem_src(&d.cinfo, const_cast<uint8_t*>(data), static_cast<unsigned long>(size));
  jpeg_save_markers(&d.cinfo, JPEG_APP0 + 1, 0xFFFF);
  jpeg_read_header(&d.cinfo, TRUE);
  return true;
}

bool read_pixels(Decoder& d, uint8_t* out, size_t row_bytes) {
  if (setjmp(d.err.jump)) return false;
  jpeg_start_decompress(&d.cinfo);
  while (d.cinfo.output_scanline < d.cinfo.output_height) {
    JSAMPROW row = out + size_t(d.cinfo.output_scanline) * row_bytes;
    jpeg_read_scanlines(&d.cinfo, &row, 1);
  }
  jpeg_finish_decompress(&d.cinfo);
  return true;
}

}  // namespace

bool jpeg_decoding_available() { return true; }

std::optional<at::Tensor> decode_jpeg_like_pil(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;  // the general decoder names what is wrong
  char magic[3] = {0, 0, 0};
  if (!in.read(magic, 3) || uint8_t(magic[0]) != 0xFF || uint8_t(magic[1]) != 0xD8 || uint8_t(magic[2]) != 0xFF)
    return std::nullopt;
  in.seekg(0);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Decoder d;
  VIDIT_CHECK(read_header(d, bytes.data(), bytes.size()), "image '", path, "': a damaged JPEG (libjpeg: ",
              d.err.message, ")");
  // The saved markers live in libjpeg's per-image memory, freed when decoding finishes: read now.
  int orientation = 1;
  for (jpeg_saved_marker_ptr m = d.cinfo.marker_list; m; m = m->next)
    if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 && std::memcmp(m->data, "Exif\0\0", 6) == 0) {
      orientation = exif_orientation_of(m->data, m->data_length);
      break;
    }
  const J_COLOR_SPACE space = d.cinfo.jpeg_color_space;
  const bool grey = space == JCS_GRAYSCALE, cmyk = space == JCS_CMYK || space == JCS_YCCK;
  d.cinfo.out_color_space = grey ? JCS_GRAYSCALE : cmyk ? JCS_CMYK : JCS_RGB;
  d.cinfo.dct_method = JDCT_ISLOW;  // PIL's (and libjpeg's) default
  d.cinfo.do_fancy_upsampling = TRUE;
  const int64_t h = d.cinfo.image_height, w = d.cinfo.image_width, c = grey ? 1 : cmyk ? 4 : 3;
  VIDIT_CHECK(h > 0 && w > 0, "image '", path, "': a JPEG of no pixels");
  at::Tensor pixels = at::empty({h, w, c}, at::kByte);
  VIDIT_CHECK(read_pixels(d, pixels.data_ptr<uint8_t>(), size_t(w * c)), "image '", path,
              "': a damaged JPEG (libjpeg: ", d.err.message, ")");
  VIDIT_CHECK(!d.err.truncated, "image '", path, "': the JPEG ends before its last pixels (a truncated file); "
              "copy or download it again");
  const at::Tensor rgb = grey ? pixels.expand({h, w, 3}).contiguous() : cmyk ? cmyk_to_rgb(pixels) : pixels;
  return apply_exif_orientation(rgb, orientation);
}

#endif  // VIDIT_HAVE_LIBJPEG

}  // namespace vidit::vision

#include "prepare/demo_codec.h"

#include "core/error.h"

namespace vidit::demo {

at::Tensor codec_encode(const at::Tensor& frames, int64_t b) {
  VIDIT_CHECK(frames.dim() == 4 && frames.size(3) == 3 && frames.size(1) % b == 0 && frames.size(2) % b == 0,
              "demo codec: frames must be [T, H, W, 3] with H and W divisible by ", b, ", got ", frames.sizes());
  const int64_t T = frames.size(0), H = frames.size(1), W = frames.size(2);
  at::Tensor x = frames.to(at::kFloat) / 127.5 - 1.0;           // [T, H, W, 3]
  x = x.view({T, H / b, b, W / b, b, 3}).permute({5, 2, 4, 0, 1, 3});  // [3, b, b, T, H/b, W/b]
  return x.reshape({3 * b * b, T, H / b, W / b}).contiguous();
}

at::Tensor codec_decode(const at::Tensor& latent, int64_t b) {
  VIDIT_CHECK(latent.dim() == 4 && latent.size(0) == 3 * b * b, "demo codec: latent must be [",
              3 * b * b, ", T, h, w], got ", latent.sizes());
  const int64_t T = latent.size(1), h = latent.size(2), w = latent.size(3);
  at::Tensor x = latent.to(at::kFloat).view({3, b, b, T, h, w}).permute({3, 4, 1, 5, 2, 0});
  x = x.reshape({T, h * b, w * b, 3});
  return ((x + 1.0) * 127.5).round().clamp(0, 255).to(at::kByte).contiguous();
}

}  // namespace vidit::demo

#include "demo/demo_data.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/video_decoder.h"
#include "demo/caption_embedder.h"
#include "demo/demo_codec.h"
#include "demo/shapes.h"

namespace vidit::demo {

at::Tensor centre_crop(const at::Tensor& f, int64_t size, int64_t keep) {
  VIDIT_CHECK(f.size(0) >= keep && f.size(1) >= size && f.size(2) >= size, "clip of ", f.sizes(),
              " is smaller than the demo's ", keep, " frames of ", size, "x", size);
  const int64_t top = (f.size(1) - size) / 2, left = (f.size(2) - size) / 2;
  return f.slice(0, 0, keep).slice(1, top, top + size).slice(2, left, left + size).contiguous();
}

std::vector<VideoEntry> make_demo_videos(const Config& cfg, const std::string& dir) {
  std::filesystem::create_directories(dir);
  const auto& d = cfg.demo;
  // A few frame sizes and lengths; the object always moves inside the central training crop.
  const int64_t sizes[3][2] = {{d.frame_size, d.frame_size},
                               {d.frame_size + 8, d.frame_size},
                               {d.frame_size + 16, d.frame_size + 8}};
  const int64_t lengths[3] = {d.frames, d.frames + 2, d.frames + 4};
  std::vector<std::tuple<int, int, Direction>> combos;
  for (int c = 0; c < int(palette().size()); ++c)
    for (Direction dir : directions())
      if (!held_out(c, dir))
        for (int s = 0; s < int(shape_names().size()); ++s) combos.emplace_back(c, s, dir);

  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(cfg.train.seed + 7);
  std::vector<VideoEntry> out;
  std::ofstream list(dir + "/captions.jsonl");
  for (int64_t i = 0; i < d.videos; ++i) {
    auto [colour, shape, direction] = combos[size_t(i) % combos.size()];
    const auto* sz = sizes[i % 3];
    ClipSpec spec = random_clip(colour, shape, direction, sz[0], sz[1], lengths[(i / 3) % 3],
                                d.frame_size, gen, d.frames);
    char name[32];
    std::snprintf(name, sizeof name, "clip_%04lld.mp4", static_cast<long long>(i));
    std::string path = dir + "/" + name;
    encode_video_mp4(path, render_clip(spec), 8.0, /*crf=*/10);
    out.push_back({path, caption(spec)});
    list << nlohmann::json{{"path", path}, {"caption", out.back().caption}}.dump() << "\n";
  }
  return out;
}

LoadedDemo load_demo_dataset(const Config& cfg, const std::vector<VideoEntry>& entries) {
  const auto& d = cfg.demo;
  std::vector<at::Tensor> latents, texts;
  LoadedDemo out;
  for (const auto& e : entries) {
    try {
      DecodedVideo v = decode_video(e.path, d.frames);
      latents.push_back(codec_encode(centre_crop(v.frames, d.frame_size, d.frames), d.codec_block));
      texts.push_back(embed_caption(e.caption, cfg.model.text_len, cfg.model.text_dim));
    } catch (const Error& err) {
      out.skipped.push_back(e.path + ": " + err.what());
    }
  }
  VIDIT_CHECK(!latents.empty(), "none of the ", entries.size(), " demo videos could be decoded; first error: ",
              out.skipped.empty() ? "?" : out.skipped.front());
  out.dataset = std::make_shared<TensorDataset>(at::stack(latents), at::stack(texts));
  return out;
}

}  // namespace vidit::demo

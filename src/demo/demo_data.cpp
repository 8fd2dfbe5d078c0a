#include "demo/demo_data.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/buckets.h"
#include "prepare/frame_encoder.h"
#include "loader/latent_cache.h"
#include "video/video_decoder.h"
#include "demo/shapes.h"

namespace vidit::demo {

std::vector<VideoEntry> make_demo_videos(const Config& cfg, const std::string& dir) {
  std::filesystem::create_directories(dir);
  const auto& d = cfg.demo;
  // A few frame sizes (width x height: square, 5:4 and 3:2) and lengths; the object always moves
  // inside the central frame_size square, which every bucket's crop keeps.
  const int64_t sizes[3][2] = {{d.frame_size, d.frame_size},
                               {d.frame_size * 5 / 4, d.frame_size},
                               {d.frame_size * 3 / 2, d.frame_size}};
  const int64_t lengths[3] = {d.frames, d.frames + 2, d.frames + 4};
  std::vector<std::tuple<int, int, Direction>> combos;
  for (int c = 0; c < int(palette().size()); ++c)
    for (Direction dir : directions())
      if (!held_out(c, dir))
        for (int s = 0; s < int(shape_names().size()); ++s) combos.emplace_back(c, s, dir);

  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(cfg.train.seed + 7);
  // Which clips leave the colour out of their caption: drawn from their own stream, so the
  // clips themselves do not change with the fraction. Direction words then also appear apart
  // from any colour, which keeps the model from reading a direction off the colour word.
  at::Generator caption_gen = at::make_generator<at::CPUGeneratorImpl>(cfg.train.seed + 11);
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
    const bool colourless = d.colourless_captions > 0 &&
                            at::rand({1}, caption_gen, at::kDouble).item<double>() < d.colourless_captions;
    out.push_back({path, caption(spec, !colourless)});
    list << nlohmann::json{{"path", name}, {"caption", out.back().caption}}.dump() << "\n";  // relative to dir
  }
  return out;
}

DemoData prepare_demo_data(const Config& cfg, const std::string& out_dir, int rank, int world) {
  const auto& d = cfg.demo;
  VIDIT_CHECK(cfg.data.codec == Codec::demo && cfg.data.text_encoder == TextEncoder::demo, cfg.source,
              ": the demo caches with data.codec = \"demo\" and data.text_encoder = \"demo\" (got \"",
              cfg.data.codec, "\" and \"", cfg.data.text_encoder, "\")");
  const Bucket square{d.frames, d.frame_size, d.frame_size, 1.0};
  bool has_square = false;
  for (const Bucket& b : make_buckets(cfg.buckets))
    has_square |= b.frames == square.frames && b.height == square.height && b.width == square.width;
  VIDIT_CHECK(has_square, cfg.source, ": [buckets] has no ", square.name(), " bucket (demo.frames x demo.frame_size^2), "
              "the shape the demo samples at; add buckets.aspect_ratios 1.0 and a matching resolution tier");

  DemoData out;
  out.videos = make_demo_videos(cfg, out_dir + "/videos");
  Config c = cfg;
  c.data.manifest = out_dir + "/videos/captions.jsonl";
  c.data.cache_dir = out_dir + "/cache";
  // The cache is rebuilt every time (seconds): the videos are deterministic, so a resumed demo
  // reads the same samples in the same order.
  std::filesystem::remove_all(c.data.cache_dir);
  out.report = prepare_cache(c, make_frame_encoder(c), make_caption_encoder(c));
  out.cache_dir = c.data.cache_dir;
  auto cache = std::make_shared<LatentCache>(c.data.cache_dir);
  VIDIT_CHECK(cache->size() > 0, "none of the ", out.videos.size(), " demo videos could be cached; see ",
              c.data.cache_dir, "/rejects.jsonl");
  out.loader = std::make_shared<CacheLoader>(cache, c, rank, world);
  return out;
}

}  // namespace vidit::demo

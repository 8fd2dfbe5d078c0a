// Loader throughput against a plain sequential read of the same shard files, in one run.
//
// Writes a latent cache of synthetic samples (Wan-like latents: 16 channels, bf16 mean + std,
// text embeddings) spread over a few buckets, then, with the page cache warm for both:
//   read:   every shard file read start to end with read(2) into one buffer (the floor any
//           loader pays to touch the bytes);
//   loader: one epoch of CacheLoader batches (mmap, checksum of every sample, stacking, text
//           padding) with --threads loader threads.
// Prints GB/s of shard bytes for both and their ratio (goal >= 0.8), plus cache bytes per
// sample and per hour of source video for each bucket (at --fps).
//   bench_loader [--dir D] [--samples N] [--threads T] [--repeats R] [--fps F]
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "loader/cache_loader.h"
#include "loader/latent_cache.h"

using namespace vidit;
namespace fs = std::filesystem;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int64_t read_all(const std::vector<std::string>& files, std::vector<char>& buf) {
  int64_t total = 0;
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) continue;
    for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) total += n;
    ::close(fd);
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"latent cache loader vs sequential read"};
  std::string dir = "/tmp/vidit_bench_cache";
  int samples = 192, threads = 2, repeats = 3;
  double fps = 16;
  app.add_option("--dir", dir);
  app.add_option("--samples", samples);
  app.add_option("--threads", threads);
  app.add_option("--repeats", repeats);
  app.add_option("--fps", fps, "source frame rate for the bytes-per-hour figure");
  CLI11_PARSE(app, argc, argv);

  // Three buckets of Wan-VAE latents (16 ch; 4x8x8 compression): 17x256x256, 33x256x448, 33x448x256 frames x pixels.
  struct B { const char* name; int64_t frames, t, h, w; };
  const B buckets[] = {{"17x256x256", 17, 5, 32, 32}, {"33x256x448", 33, 9, 32, 56}, {"33x448x256", 33, 9, 56, 32}};
  fs::remove_all(dir);
  {
    CacheWriter w(dir, 0, 64 << 20);
    for (int i = 0; i < samples; ++i) {
      const B& b = buckets[i % 3];
      CacheSample s;
      s.key = cache_key("clip" + std::to_string(i), -1, -1);
      s.mean = at::randn({16, b.t, b.h, b.w});
      s.std = at::rand({16, b.t, b.h, b.w});
      s.text = at::randn({64, 256});
      s.bucket = b.name;
      s.meta = {{"fps", fps}, {"frames", b.frames}};
      w.add(s);
    }
  }
  merge_cache_index(dir);
  std::vector<std::string> files;
  int64_t shard_bytes = 0;
  for (const auto& e : fs::directory_iterator(dir + "/shards")) files.push_back(e.path().string()), shard_bytes += int64_t(e.file_size());

  Config cfg = parse_config("", "<bench>", {"model.in_channels=16", "model.out_channels=16", "model.text_dim=256",
                                           "model.text_len=64", "data.source=\"cache\"", "data.cache_dir=\"" + dir + "\"",
                                           "data.loader_threads=" + std::to_string(threads), "data.prefetch=8",
                                           "data.token_budget=16384"});
  auto cache = std::make_shared<LatentCache>(dir);
  std::vector<char> buf(8 << 20);
  read_all(files, buf);  // warm the page cache
  double best_read = 1e30, best_load = 1e30;
  for (int r = 0; r < repeats; ++r) {
    double t0 = now();
    read_all(files, buf);
    best_read = std::min(best_read, now() - t0);
    CacheLoader loader(cache, cfg);
    t0 = now();
    int64_t got = 0;
    while (got < cache->size()) got += loader.next().latents.size(0);
    best_load = std::min(best_load, now() - t0);
  }
  const double read_gbs = double(shard_bytes) / best_read / 1e9, load_gbs = double(shard_bytes) / best_load / 1e9;
  std::printf("%-28s %10s %10s\n", "", "GB/s", "seconds");
  std::printf("%-28s %10.2f %10.4f\n", "sequential read (warm)", read_gbs, best_read);
  std::printf("%-28s %10.2f %10.4f\n", ("CacheLoader, " + std::to_string(threads) + " threads").c_str(), load_gbs, best_load);
  std::printf("ratio loader / read: %.2f (goal >= 0.8); %d samples, %.1f MB of shards\n", load_gbs / read_gbs, samples,
              double(shard_bytes) / 1e6);
  std::map<std::string, std::pair<int64_t, int64_t>> per;  // bucket -> (bytes, frames)
  for (int64_t i = 0; i < cache->size(); ++i) {
    const auto& e = cache->entry(i);
    int64_t n = 1;
    for (auto d : e.shape) n *= d;
    per[e.bucket].first += 2 * n * 2 + 64 * 256 * 4;  // bf16 mean + std, fp32 text
    per[e.bucket].second += e.meta["frames"].get<int64_t>();
  }
  std::printf("cache bytes per hour of source video at %.0f fps (bf16 mean + std, 64x256 fp32 text):\n", fps);
  for (const auto& [b, v] : per)
    std::printf("  %-14s %8.2f GB/hour\n", b.c_str(), double(v.first) / (double(v.second) / fps / 3600.0) / 1e9);
  std::printf("{\"read_gbs\": %.3f, \"loader_gbs\": %.3f, \"ratio\": %.3f}\n", read_gbs, load_gbs, load_gbs / read_gbs);
  fs::remove_all(dir);
  return 0;
}

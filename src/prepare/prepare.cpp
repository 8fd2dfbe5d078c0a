#include "prepare/prepare.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"
#include "prepare/buckets.h"
#include "loader/latent_cache.h"
#include "prepare/manifest.h"
#include "video/video_decoder.h"

namespace vidit {
namespace fs = std::filesystem;
namespace {

// Appends one JSON line per rejected input and flushes it, so a crash loses none.
class RejectLog {
 public:
  RejectLog(const std::string& path) : out_(path, std::ios::trunc) {
    VIDIT_CHECK(out_, "cannot write '", path, "'");
  }
  void add(const std::string& input, const std::string& where, const std::string& reason) {
    out_ << nlohmann::json{{"input", input}, {"where", where}, {"reason", reason}}.dump() << "\n";
    out_.flush();
    ++count_;
  }
  int64_t count() const { return count_; }

 private:
  std::ofstream out_;
  int64_t count_ = 0;
};

// Refuses a text embedding file the model cannot use, at prepare time rather than mid-training.
void check_text_embedding(const std::string& path, const ModelConfig& m) {
  at::Tensor x = read_text_embedding(path);
  VIDIT_CHECK(x.dim() == 2 && x.size(1) == m.text_dim && x.size(0) <= m.text_len, "text embedding '", path,
              "' has shape ", x.sizes(), "; the model wants [<= ", m.text_len, ", ", m.text_dim,
              "] (model.text_len, model.text_dim)");
}

std::string worker_name(int w) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "w%03d", w);
  return buf;
}

}  // namespace

int64_t merge_prepared(const std::string& dir) {
  const int64_t n = merge_cache_index(dir);
  std::string all;
  std::vector<fs::path> parts;
  if (fs::is_directory(dir + "/rejects"))
    for (const auto& e : fs::directory_iterator(dir + "/rejects")) parts.push_back(e.path());
  std::sort(parts.begin(), parts.end());
  for (const auto& p : parts) {
    std::ifstream in(p);
    all.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  write_file_atomic(dir + "/rejects.jsonl", all);
  return n;
}

PrepareReport prepare_cache(const Config& cfg, const FrameEncoder& encode, const CaptionEncoder& captions,
                            int worker, int workers) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto& d = cfg.data;
  VIDIT_CHECK(!d.manifest.empty(), cfg.source, ": vidit prepare needs data.manifest (a .jsonl / .csv file or a folder)");
  VIDIT_CHECK(!d.cache_dir.empty(), cfg.source, ": vidit prepare needs data.cache_dir (where the cache goes)");
  VIDIT_CHECK(workers >= 1 && worker >= 0 && worker < workers, "vidit prepare: worker ", worker, " of ", workers,
              " is out of range");
  VIDIT_CHECK(d.text_encoder == TextEncoder::precomputed || captions, "vidit prepare: data.text_encoder = \"", d.text_encoder,
              "\" but no caption encoder was given");
  const std::vector<Bucket> buckets = make_buckets(cfg.buckets);
  Manifest manifest = read_manifest(d.manifest);
  fs::create_directories(d.cache_dir + "/rejects");
  fs::create_directories(d.cache_dir + "/done");
  fs::remove(d.cache_dir + "/done/" + worker_name(worker));
  RejectLog rejects(d.cache_dir + "/rejects/" + worker_name(worker) + ".jsonl");
  if (worker == 0)
    for (const auto& r : manifest.rejected) rejects.add("", r.where, r.reason);

  PrepareReport rep;
  CacheWriter writer(d.cache_dir, worker, d.shard_mb << 20, d.cache_dtype == Precision::bf16 ? at::kBFloat16 : at::kFloat);
  DecodeOptions opt;
  opt.target_fps = d.fps;
  opt.threads = int(d.decode_threads);
  opt.device = parse_decode_device(name_of(d.decoder), "data.decoder");
  opt.square_pixels = cfg.data.square_pixels;
  const int64_t longest = *std::max_element(cfg.buckets.frames.begin(), cfg.buckets.frames.end());
  for (size_t i = size_t(worker); i < manifest.entries.size(); i += size_t(workers)) {
    const ManifestEntry& e = manifest.entries[i];
    ++rep.entries;
    const std::string key = cache_key(e.path, e.start, e.end);
    if (writer.done().count(key)) {
      ++rep.already_done;
      continue;
    }
    try {
      DecodeOptions o = opt;
      if (e.start >= 0) o.start_seconds = e.start;
      if (e.end >= 0) o.end_seconds = e.end;
      o.max_frames = longest;
      DecodedVideo v = decode_video(e.path, o);
      const BucketChoice choice = assign_bucket(buckets, v.width, v.height, v.frames.size(0), cfg.buckets.max_upscale);
      if (!choice.ok()) {
        rejects.add(e.path, e.where, choice.reason);
        continue;
      }
      const Bucket& b = buckets[size_t(choice.index)];
      CacheSample s;
      s.key = key;
      s.bucket = b.name();
      if (d.text_encoder == TextEncoder::precomputed) {
        VIDIT_CHECK(!e.text_embedding.empty(), "no text_embedding file for this clip (data.text_encoder = \"precomputed\")");
        check_text_embedding(e.text_embedding, cfg.model);
        s.text_ref = e.text_embedding;
      } else {
        s.text = captions(e.caption);
      }
      std::tie(s.mean, s.std) = encode(fit_to_bucket(v.frames, b));
      // Fault injection (resilience/fault_injection.h): a sample whose latents are extreme but
      // whose checksum is valid, as a broken encoder or a bad source would leave it.
      if (cfg.faults.kind == FaultKind::poison_cache && !cfg.faults.sample.empty() &&
          (cfg.faults.sample == key || cfg.faults.sample == std::filesystem::path(e.path).filename().string())) {
        s.mean = s.mean * 1000;
        std::fprintf(stderr, "fault injection: the cache entry of %s (%s) is written with its latents x 1000\n",
                     e.path.c_str(), key.c_str());
      }
      const double fps = v.fps > 0 ? v.fps : 0;
      s.meta = {{"source", e.path}, {"caption", e.caption}, {"start", e.start}, {"end", e.end},
                {"fps", fps}, {"frames", b.frames}, {"source_size", {v.width, v.height}}};
      writer.add(s);
      ++rep.written;
      ++rep.per_bucket[b.name()];
      if (fps > 0) rep.source_seconds += double(b.frames) / fps;
    } catch (const std::exception& ex) {
      // One unusable video never stops the run: record it and go on.
      rejects.add(e.path, e.where, ex.what());
    }
  }
  writer.flush();
  rep.rejected = rejects.count();
  write_file_atomic(d.cache_dir + "/done/" + worker_name(worker),
                    nlohmann::json{{"written", rep.written}, {"rejected", rep.rejected}}.dump());
  int finished = 0;
  for (int w = 0; w < workers; ++w) finished += fs::exists(d.cache_dir + "/done/" + worker_name(w));
  if (finished == workers) {
    merge_prepared(d.cache_dir);
    rep.merged = true;
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace vidit

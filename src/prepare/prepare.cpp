#include "prepare/prepare.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <set>
#include <map>

#include "core/error.h"
#include "core/safetensors.h"
#include "loader/buckets.h"
#include "prepare/clips.h"
#include "loader/latent_cache.h"
#include "prepare/manifest.h"
#include "video/video_decoder.h"

namespace vidit {
namespace fs = std::filesystem;
namespace {

// Appends one JSON line per rejected input and flushes it, so a crash loses none; counts the
// rejects per category, in the report and on the progress line.
class RejectLog {
 public:
  RejectLog(const std::string& path, Progress& progress) : out_(path, std::ios::trunc), progress_(progress) {
    VIDIT_CHECK(out_, "cannot write '", path, "'");
  }
  void add(const std::string& input, const std::string& where, const std::string& reason, const std::string& category) {
    out_ << nlohmann::json{{"input", input}, {"where", where}, {"reason", reason}, {"category", category}}.dump() << "\n";
    out_.flush();
    ++count_;
    ++by_category_[category];
    progress_.count("rejected/" + category);
  }
  int64_t count() const { return count_; }
  const std::map<std::string, int64_t>& by_category() const { return by_category_; }

 private:
  std::ofstream out_;
  Progress& progress_;
  int64_t count_ = 0;
  std::map<std::string, int64_t> by_category_;
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

nlohmann::json report_json(const PrepareReport& r) {
  return {{"entries", r.entries}, {"written", r.written}, {"already_done", r.already_done}, {"reembedded", r.reembedded}, {"rejected", r.rejected},
          {"seconds", r.seconds}, {"source_seconds", r.source_seconds}, {"per_bucket", r.per_bucket},
          {"rejected_by", r.rejected_by}, {"videos_cut", r.videos_cut}, {"warned_by", r.warned_by}};
}

// The key under which a video's clip plan is recorded: its path and manifest window, and every
// setting that changes which clips it gives.
std::string video_plan_key(const ManifestEntry& e, const DataConfig& d) {
  char settings[160];
  std::snprintf(settings, sizeof settings, "|clips %.17g %.17g %lld %d %.17g fps %.17g", d.clip_seconds,
                d.clip_stride_seconds, static_cast<long long>(d.max_clips_per_video), int(d.split_scenes),
                d.scene_threshold, d.fps);
  return cache_key(e.path + settings, e.start, e.end);
}

// clips/w*.jsonl of every worker: video plan key -> the keys of its clips (the latest line wins).
std::map<std::string, std::vector<std::string>> read_clip_plans(const std::string& dir) {
  std::map<std::string, std::vector<std::string>> plans;
  if (!fs::is_directory(dir + "/clips")) return plans;
  for (const auto& f : fs::directory_iterator(dir + "/clips")) {
    if (f.path().extension() != ".jsonl") continue;
    std::ifstream in(f.path());
    std::string line;
    while (std::getline(in, line)) {
      try {  // a line cut short by a crash only means that video is decoded again
        const nlohmann::json j = nlohmann::json::parse(line);
        plans[j.at("video").get<std::string>()] = j.at("clips").get<std::vector<std::string>>();
      } catch (const std::exception&) {
      }
    }
  }
  return plans;
}

std::string seconds_range(double a, double b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "[%.3f, %.3f) s", a, b);
  return buf;
}

// Every worker of several rewrites <cache_dir>/progress/w{W}.json every few seconds (and when it
// ends); worker 0 reads the others' to show the totals. A file last written well before this
// worker's own first one is an earlier run's and is left out (modification times compared on
// the one file system, so the hosts' clocks need not agree).
class ProgressBoard {
 public:
  static constexpr double kEverySeconds = 5;

  // Worker 0 of several shows the totals after its own numbers on each line of `p`.
  ProgressBoard(Progress& p, const std::string& cache_dir, int worker, int workers, int64_t all_entries)
      : progress_(p), dir_(cache_dir + "/progress"), worker_(worker), workers_(workers), all_entries_(all_entries) {
    if (workers_ <= 1) return;
    fs::create_directories(dir_);
    if (worker_ == 0) progress_.set_note([this](const ProgressSnapshot& mine) { return totals(mine); });
  }

  // Writes this worker's file and (worker 0) reads the others' when kEverySeconds have passed
  // since the last time, or now.
  void update(bool now = false) {
    if (workers_ <= 1 || (!now && progress_.elapsed() - last_ < kEverySeconds)) return;
    last_ = progress_.elapsed();
    const std::string mine = dir_ + "/" + worker_name(worker_) + ".json";
    try {
      write_file_atomic(mine, nlohmann::json{{"worker", worker_}, {"workers", workers_}, {"finished", now},
                                             {"progress", progress_.snapshot().to_json()}}.dump());
      if (!since_) since_ = fs::last_write_time(mine) - std::chrono::seconds(60);
    } catch (const std::exception& e) {
      // Only the display of the totals depends on these files: say so once and go on.
      if (!warned_) std::fprintf(stderr, "warning: cannot write the progress file %s (%s)\n", mine.c_str(), e.what());
      warned_ = true;
    }
    if (worker_ == 0 && since_) read_others();
  }

 private:
  void read_others() {
    others_.clear();
    not_heard_ = 0;
    for (int w = 0; w < workers_; ++w) {
      if (w == worker_) continue;
      const std::string path = dir_ + "/" + worker_name(w) + ".json";
      std::error_code ec;
      const auto when = fs::last_write_time(path, ec);
      if (ec || when < *since_) {
        ++not_heard_;
        continue;
      }
      try {
        std::ifstream in(path);
        others_.push_back(ProgressSnapshot::from_json(nlohmann::json::parse(in).at("progress")));
      } catch (const std::exception&) {
        ++not_heard_;  // damaged (the file is replaced whole, never seen half written): next time
      }
    }
  }

  // "all 4 workers: 350/3000 videos 11%, clips 300, rejected 50, 7.10 videos/s, 6m05s left":
  // this worker's numbers as they are now, the others' as last read.
  std::string totals(const ProgressSnapshot& mine) const {
    std::vector<ProgressSnapshot> parts = others_;
    parts.push_back(mine);
    ProgressSnapshot all = sum_progress(parts);
    all.total = all_entries_;
    std::string out = "all " + std::to_string(workers_) + " workers: " + std::to_string(all.done) + "/" +
                      std::to_string(all.total) + " videos";
    if (all.total > 0) out += " " + std::to_string(all.done * 100 / all.total) + "%";
    out += ", clips " + std::to_string(all.counter("clips"));
    int64_t rejected = 0;
    for (const auto& [name, n] : all.counters)
      if (name.rfind("rejected/", 0) == 0) rejected += n;
    out += ", rejected " + std::to_string(rejected);
    if (all.rate > 0) {
      char buf[48];
      std::snprintf(buf, sizeof buf, all.rate >= 1 ? ", %.2f videos/s" : ", %.1f s/video", all.rate >= 1 ? all.rate : 1 / all.rate);
      out += buf;
    }
    const double left = all.seconds_left();
    if (left >= 0) out += ", " + short_duration(left) + " left";
    if (not_heard_) out += " (" + std::to_string(not_heard_) + " not heard from)";
    return out;
  }

  Progress& progress_;
  std::string dir_;
  int worker_, workers_;
  int64_t all_entries_;
  double last_ = -1e300;
  std::optional<fs::file_time_type> since_;
  std::vector<ProgressSnapshot> others_;  // worker 0: the others' last published numbers
  int not_heard_ = 0;                     // worker 0: others with no file from this run yet
  bool warned_ = false;
};

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
                            int worker, int workers, const Progress::Options* progress) {
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

  const int64_t n_all = int64_t(manifest.entries.size());
  Progress::Options po = progress ? *progress : Progress::Options{};
  if (!progress) po.out = nullptr;  // counted, never shown
  po.label = workers > 1 ? "prepare w" + std::to_string(worker) + " of " + std::to_string(workers) : "prepare";
  po.unit = "video";
  po.total = n_all > worker ? (n_all - worker + workers - 1) / workers : 0;
  Progress prog(po);
  prog.count("clips", 0);
  prog.count("cached", 0);
  ProgressBoard board(prog, d.cache_dir, worker, workers, n_all);
  board.update();

  RejectLog rejects(d.cache_dir + "/rejects/" + worker_name(worker) + ".jsonl", prog);
  if (worker == 0)
    for (const auto& r : manifest.rejected) rejects.add("", r.where, r.reason, "manifest");

  PrepareReport rep;
  CacheWriter writer(d.cache_dir, worker, d.shard_mb << 20, d.cache_dtype == Precision::bf16 ? at::kBFloat16 : at::kFloat);
  DecodeOptions opt;
  opt.target_fps = d.fps;
  opt.threads = int(d.decode_threads);
  opt.device = parse_decode_device(name_of(d.decoder), "data.decoder");
  opt.square_pixels = cfg.data.square_pixels;
  const int64_t longest = *std::max_element(cfg.buckets.frames.begin(), cfg.buckets.frames.end());

  // Caption of entry `e` into `s` (its text embedding, or the precomputed file it names).
  auto caption_into = [&](const ManifestEntry& e, CacheSample& s) {
    if (d.text_encoder == TextEncoder::precomputed) {
      VIDIT_CHECK(!e.text_embedding.empty(), "no text_embedding file for this clip (data.text_encoder = \"precomputed\")");
      check_text_embedding(e.text_embedding, cfg.model);
      s.text_ref = e.text_embedding;
    } else {
      s.text = captions(e.caption);
    }
  };
  // Buckets, encodes and writes the clip `frames` [T, H, W, 3] of entry `e` as `s` (key, text and
  // meta already set); `stage` follows the work for the reject category.
  auto encode_and_write = [&](const ManifestEntry& e, const at::Tensor& frames, double fps, CacheSample& s,
                              const char*& stage) {
    stage = "bucket";
    const BucketChoice choice = assign_bucket(buckets, frames.size(2), frames.size(1), frames.size(0), cfg.buckets.max_upscale);
    VIDIT_CHECK(choice.ok(), choice.reason);
    const Bucket& b = buckets[size_t(choice.index)];
    s.bucket = b.name();
    stage = "encode";
    std::tie(s.mean, s.std) = encode(fit_to_bucket(frames, b));
    // Fault injection (resilience/fault_injection.h): a sample whose latents are extreme but
    // whose checksum is valid, as a broken encoder or a bad source would leave it.
    if (cfg.faults.kind == FaultKind::poison_cache && !cfg.faults.sample.empty() &&
        (cfg.faults.sample == s.key || cfg.faults.sample == std::filesystem::path(e.path).filename().string())) {
      s.mean = s.mean * 1000;
      std::fprintf(stderr, "fault injection: the cache entry of %s (%s) is written with its latents x 1000\n",
                   e.path.c_str(), s.key.c_str());
    }
    s.meta["fps"] = fps;
    s.meta["frames"] = b.frames;
    stage = "write";
    writer.add(s);
    ++rep.written;
    ++rep.per_bucket[b.name()];
    prog.count("clips");
    if (fps > 0) rep.source_seconds += double(b.frames) / fps;
  };

  // A cached clip whose caption (or precomputed embedding file) is no longer the manifest's gets
  // its new text without its video being decoded or encoded again: its latents are copied from
  // its shard, checked, into a new revision of its key, which replaces the old one in the index.
  auto stale_caption = [&](const ManifestEntry& e, const CachedKey& c) {
    return d.text_encoder == TextEncoder::precomputed ? c.text_ref != e.text_embedding
                                                      : c.caption_digest != caption_digest(e.caption);
  };
  auto reembed = [&](const ManifestEntry& e, const std::string& key) {
    CacheSample s = read_cached_sample(d.cache_dir, writer.cached_entry(key));
    s.text = at::Tensor();
    s.text_ref.clear();
    caption_into(e, s);
    s.meta["caption"] = e.caption;
    ++s.rev;
    writer.add(s);
    ++rep.reembedded;
    prog.count("re-embedded");
  };

  // Many clips per video (data.clip_seconds): see the header of prepare.h.
  const bool cutting = d.clip_seconds > 0 || d.split_scenes;
  VIDIT_CHECK(!d.split_scenes || d.clip_seconds > 0, cfg.source, ": data.split_scenes needs data.clip_seconds (the ",
              "length of the clips cut from each scene), e.g. data.clip_seconds = 5");
  const ClipSpec spec{d.clip_seconds, d.clip_stride_seconds, d.max_clips_per_video};
  std::map<std::string, std::vector<std::string>> plans;
  std::ofstream plan_log;
  if (cutting) {
    check_clip_spec(spec);
    plans = read_clip_plans(d.cache_dir);
    fs::create_directories(d.cache_dir + "/clips");
    const std::string f = d.cache_dir + "/clips/" + worker_name(worker) + ".jsonl";
    plan_log.open(f, std::ios::app);
    VIDIT_CHECK(plan_log, "cannot write '", f, "'");
  }
  // An unusable video is recorded with the category of the stage it failed in ("missing" when a
  // decode failed because the file is not there).
  auto reject = [&](const ManifestEntry& e, const std::exception& ex, const char* stage) {
    std::error_code ec;
    const bool missing = std::string(stage) == "decode" && !fs::exists(e.path, ec);
    rejects.add(e.path, e.where, ex.what(), missing ? "missing" : stage);
  };
  auto cut_video = [&](const ManifestEntry& e) {
    const std::string vkey = video_plan_key(e, d);
    if (auto it = plans.find(vkey); it != plans.end()) {
      bool all = true;
      for (const auto& k : it->second) all = all && writer.done().count(k);
      if (all) {  // every clip of this video is in a finished shard: nothing to decode
        for (const auto& k : it->second) {
          if (!stale_caption(e, writer.done().at(k))) {
            ++rep.already_done;
            prog.count("cached");
            continue;
          }
          try {
            reembed(e, k);
          } catch (const std::exception& ex) {
            rejects.add(e.path, e.where, std::string("its clip ") + k + " is cached with another caption and its "
                        "latents cannot be read to give it the new one (" + ex.what() + "); delete its shard and "
                        "index part and re-run vidit prepare", "caption");
          }
        }
        ++rep.videos_cut;
        board.update();
        prog.skip();
        return;
      }
    }
    const char* stage = "caption";
    try {
      CacheSample proto;
      caption_into(e, proto);
      stage = "decode";
      DecodeOptions o = opt;
      if (e.start >= 0) o.start_seconds = e.start;
      if (e.end >= 0) o.end_seconds = e.end;
      const double lo = o.start_seconds;
      double hi = o.end_seconds;
      if (const double probed = probe_video_seconds(e.path); probed > 0) hi = std::min(hi, probed);
      ClipCutter cutter(spec, lo, hi, d.split_scenes, d.scene_threshold, longest);
      std::vector<std::string> keys;
      int64_t usable = 0;  // clips written or found cached
      int64_t width = 0, height = 0;
      double last = -1, interval = 0;  // the latest frame's time and the gap before it
      auto handle = [&](std::vector<ClipCutter::Clip> clips) {
        for (auto& c : clips) {
          const std::string key = cache_key(e.path, c.window.start, c.window.end);
          const int64_t index = int64_t(keys.size());
          keys.push_back(key);
          int64_t rev = 0;
          if (auto cached = writer.done().find(key); cached != writer.done().end()) {
            if (!stale_caption(e, cached->second)) {
              ++rep.already_done;
              ++usable;
              prog.count("cached");
              continue;
            }
            try {
              reembed(e, key);
              ++usable;
              continue;
            } catch (const std::exception& ex) {  // its latents unreadable: encoded again from these frames
              std::fprintf(stderr, "warning: %s: clip %s: %s; encoding it again\n", e.path.c_str(), key.c_str(), ex.what());
              rev = cached->second.rev + 1;
            }
          }
          const char* clip_stage = "bucket";
          try {
            VIDIT_CHECK(c.frames.defined(), "no frame in the clip window");
            CacheSample s = proto;
            s.key = key;
            s.rev = rev;
            const double fps = o.target_fps > 0 ? o.target_fps : interval > 0 ? 1 / interval : 0;
            s.meta = {{"source", e.path}, {"caption", e.caption}, {"start", c.window.start}, {"end", c.window.end},
                      {"clip", index}, {"source_size", {width, height}}};
            if (c.window.whole) s.meta["whole_video"] = true;
            encode_and_write(e, c.frames, fps, s, clip_stage);
            ++usable;
          } catch (const std::exception& ex) {
            // One clip that cannot be used: recorded, and the video's other clips go on.
            rejects.add(e.path, e.where + " clip " + seconds_range(c.window.start, c.window.end), ex.what(), clip_stage);
          }
        }
        board.update();
      };
      const DecodedVideo v = decode_video_streaming(e.path, o, [&](const at::Tensor& frame, double t) {
        if (last >= 0 && t > last) interval = t - last;
        last = t;
        width = frame.size(1);
        height = frame.size(0);
        handle(cutter.add(frame, t));
        return !cutter.complete();  // every clip cut: the rest of the video is not needed
      });
      const double step = v.fps > 0 ? 1 / v.fps : interval;
      handle(cutter.finish(last + step));
      if (cutter.dense_cuts()) {
        ++rep.warned_by["scenes"];
        std::fprintf(stderr,
                     "warning: %s (%s): a scene cut on nearly every frame (%zu cuts in the first %lld frames: strobe, "
                     "flicker or noise?); the rest of the video is treated as one scene. Raise data.scene_threshold "
                     "if this video has no such cuts\n",
                     e.path.c_str(), e.where.c_str(), cutter.cuts().size(), static_cast<long long>(cutter.frames_seen()));
      }
      if (keys.empty()) {
        stage = "clips";
        fail("no clip of ", d.clip_seconds, " s fits ", cutter.cuts().empty() ? std::string("the video") :
             "any scene (" + std::to_string(cutter.cuts().size()) + " scene cuts found)",
             " in ", seconds_range(lo, last + step), "; lower data.clip_seconds",
             cutter.cuts().empty() ? "" : ", or raise data.scene_threshold if these are not real cuts");
      }
      if (usable > 0) ++rep.videos_cut;
      plan_log << nlohmann::json{{"video", vkey}, {"source", e.path}, {"clips", keys}}.dump() << "\n";
      plan_log.flush();
    } catch (const std::exception& ex) {
      reject(e, ex, stage);
    }
    board.update();
    prog.advance();
  };

  for (size_t i = size_t(worker); i < manifest.entries.size(); i += size_t(workers)) {
    const ManifestEntry& e = manifest.entries[i];
    ++rep.entries;
    if (cutting) {
      cut_video(e);
      continue;
    }
    const std::string key = cache_key(e.path, e.start, e.end);
    int64_t rev = 0;
    if (auto cached = writer.done().find(key); cached != writer.done().end()) {
      if (!stale_caption(e, cached->second)) {
        ++rep.already_done;
        prog.count("cached");
        board.update();
        prog.skip();
        continue;
      }
      try {
        reembed(e, key);
        board.update();
        prog.advance();
        continue;
      } catch (const std::exception& ex) {  // its latents unreadable: decoded and encoded again below
        std::fprintf(stderr, "warning: %s (%s): %s; encoding it again\n", e.path.c_str(), e.where.c_str(), ex.what());
        rev = cached->second.rev + 1;
      }
    }
    // Where a failure happened names its reject category.
    const char* stage = "decode";
    try {
      DecodeOptions o = opt;
      if (e.start >= 0) o.start_seconds = e.start;
      if (e.end >= 0) o.end_seconds = e.end;
      o.max_frames = longest;
      DecodedVideo v = decode_video(e.path, o);
      stage = "bucket";
      // Checked before the caption is embedded, as always: a clip no bucket takes costs no text encode.
      const BucketChoice choice = assign_bucket(buckets, v.width, v.height, v.frames.size(0), cfg.buckets.max_upscale);
      VIDIT_CHECK(choice.ok(), choice.reason);
      CacheSample s;
      s.key = key;
      s.rev = rev;
      stage = "caption";
      caption_into(e, s);
      s.meta = {{"source", e.path}, {"caption", e.caption}, {"start", e.start}, {"end", e.end},
                {"source_size", {v.width, v.height}}};
      encode_and_write(e, v.frames, v.fps > 0 ? v.fps : 0, s, stage);
    } catch (const std::exception& ex) {
      reject(e, ex, stage);  // one unusable video never stops the run
    }
    board.update();
    prog.advance();
  }
  writer.flush();
  rep.rejected = rejects.count();
  rep.rejected_by = rejects.by_category();
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  board.update(/*now=*/true);
  prog.finish();
  write_file_atomic(d.cache_dir + "/done/" + worker_name(worker), report_json(rep).dump());
  int finished = 0;
  for (int w = 0; w < workers; ++w) finished += fs::exists(d.cache_dir + "/done/" + worker_name(w));
  if (finished == workers) {
    merge_prepared(d.cache_dir);
    rep.merged = true;
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

std::vector<std::string> stale_captions(const Config& cfg, const std::vector<CacheIndexEntry>& entries,
                                        int64_t* missing) {
  const Manifest manifest = read_manifest(cfg.data.manifest);
  const bool precomputed = cfg.data.text_encoder == TextEncoder::precomputed;
  std::map<std::string, const ManifestEntry*> by_key, by_source;
  std::set<std::string> repeated;  // videos listed more than once (several windows)
  for (const ManifestEntry& e : manifest.entries) {
    by_key[cache_key(e.path, e.start, e.end)] = &e;
    if (!by_source.emplace(e.path, &e).second) repeated.insert(e.path);
  }
  std::vector<std::string> out;
  int64_t gone = 0;
  for (const CacheIndexEntry& c : entries) {
    const std::string source = c.meta.value("source", std::string());
    const ManifestEntry* e = nullptr;
    if (auto k = by_key.find(c.key); k != by_key.end()) e = k->second;
    else if (auto s = by_source.find(source); s != by_source.end() && !repeated.count(source)) e = s->second;
    if (!e) {
      ++gone;
      continue;
    }
    std::ostringstream line;
    line << c.key << " " << source << " [" << c.meta.value("start", -1.0) << ", " << c.meta.value("end", -1.0) << "]: ";
    if (precomputed ? c.text_ref != e->text_embedding : c.meta.value("caption", std::string()) != e->caption) {
      line << (precomputed ? "text_embedding file changed" : "caption changed") << " (" << e->where
           << "); a rerun of vidit prepare gives it the new text without encoding the video again";
      out.push_back(line.str());
    }
  }
  if (missing) *missing = gone;
  return out;
}

PrepareReport prepare_totals(const std::string& cache_dir, int workers) {
  PrepareReport all;
  for (int w = 0; w < workers; ++w) {
    const std::string f = cache_dir + "/done/" + worker_name(w);
    if (!fs::exists(f)) continue;
    std::ifstream in(f);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const std::exception& ex) {
      fail("cannot read the worker report '", f, "': ", ex.what());
    }
    all.entries += j.value("entries", int64_t(0));
    all.written += j.value("written", int64_t(0));
    all.already_done += j.value("already_done", int64_t(0));
    all.reembedded += j.value("reembedded", int64_t(0));
    all.rejected += j.value("rejected", int64_t(0));
    all.seconds = std::max(all.seconds, j.value("seconds", 0.0));
    all.source_seconds += j.value("source_seconds", 0.0);
    const nlohmann::json per_bucket = j.value("per_bucket", nlohmann::json::object());
    const nlohmann::json rejected_by = j.value("rejected_by", nlohmann::json::object());
    for (const auto& [k, v] : per_bucket.items()) all.per_bucket[k] += v.get<int64_t>();
    for (const auto& [k, v] : rejected_by.items()) all.rejected_by[k] += v.get<int64_t>();
    all.videos_cut += j.value("videos_cut", int64_t(0));
    const nlohmann::json warned_by = j.value("warned_by", nlohmann::json::object());
    for (const auto& [k, v] : warned_by.items()) all.warned_by[k] += v.get<int64_t>();
  }
  return all;
}

std::string prepare_summary(const PrepareReport& r, const std::string& title) {
  std::vector<std::pair<std::string, std::string>> rows;
  auto num = [](int64_t n) { return std::to_string(n); };
  for (const auto& [b, n] : r.per_bucket) rows.emplace_back("clips in " + b, num(n));
  rows.emplace_back("clips written", num(r.written));
  rows.emplace_back("already cached", num(r.already_done));
  if (r.reembedded > 0) rows.emplace_back("re-embedded", num(r.reembedded) + " (new caption, latents kept)");
  for (const auto& [c, n] : r.rejected_by) rows.emplace_back("rejected: " + c, num(n));
  rows.emplace_back("rejected", num(r.rejected));
  for (const auto& [c, n] : r.warned_by) rows.emplace_back("warnings: " + c, num(n));
  rows.emplace_back("videos", num(r.entries));
  if (r.videos_cut > 0)  // cutting clips: how many came from how many videos
    rows.emplace_back("clips", num(r.written + r.already_done) + " from " + num(r.videos_cut) + " videos");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f s", r.seconds);
  rows.emplace_back("time", r.seconds < 60 ? std::string(buf) : buf + (" (" + short_duration(r.seconds) + ")"));
  // The rate counts the videos that took work (decoded), not those found already cached.
  const double rate = r.seconds > 0 ? double(r.entries - r.already_done) / r.seconds : 0;
  std::snprintf(buf, sizeof buf, "%.2f videos/s", rate);
  rows.emplace_back("rate", buf);
  std::snprintf(buf, sizeof buf, "%.1f s", r.source_seconds);
  rows.emplace_back("source video cached", buf);
  size_t left = 0, right = 0;
  for (const auto& [a, b] : rows) left = std::max(left, a.size()), right = std::max(right, b.size());
  const std::string rule = "  " + std::string(left + right + 3, '-') + "\n";
  std::string out = title + "\n" + rule;
  for (const auto& [a, b] : rows) {
    if (a == "clips written" || a == "videos") out += rule;
    out += "  " + a + std::string(left - a.size() + 3 + right - b.size(), ' ') + b + "\n";
  }
  return out + rule;
}

}  // namespace vidit

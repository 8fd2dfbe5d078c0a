#include "prepare/prepare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <memory>
#include <sstream>
#include <set>
#include <map>

#include "diffusion/frame_condition.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "loader/buckets.h"
#include "prepare/clips.h"
#include "loader/latent_cache.h"
#include "prepare/manifest.h"
#include "prepare/progress_board.h"
#include "prepare/provenance.h"
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

nlohmann::json report_json(const PrepareReport& r) {
  return {{"entries", r.entries}, {"written", r.written}, {"already_done", r.already_done}, {"reembedded", r.reembedded}, {"reencoded", r.reencoded}, {"rejected", r.rejected},
          {"seconds", r.seconds}, {"source_seconds", r.source_seconds}, {"per_bucket", r.per_bucket},
          {"rejected_by", r.rejected_by}, {"videos_cut", r.videos_cut}, {"warned_by", r.warned_by}};
}

// The key under which a video's clip plan is recorded: its path as recorded (`path`: under the
// manifest's folder, so that a moved data set finds its plans), manifest window, and every
// setting that changes which clips it gives.
std::string video_plan_key(const std::string& path, const ManifestEntry& e, const DataConfig& d) {
  char settings[160];
  std::snprintf(settings, sizeof settings, "|clips %.17g %.17g %lld %d %.17g fps %.17g", d.clip_seconds,
                d.clip_stride_seconds, static_cast<long long>(d.max_clips_per_video), int(d.split_scenes),
                d.scene_threshold, d.fps);
  return cache_key(path + settings, e.start, e.end);
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

namespace {

// One worker's pass over its slice of the manifest (see the header of prepare.h), in named steps:
// run() takes each entry of the slice through prepare_whole() (one clip per entry) or
// cut_video() (many), then finish() writes the last shard, this worker's report and, if it is
// the last worker to finish, the merged index. Each clip either reuses what the cache holds
// (reuse_cached: kept, or re-embedded when its caption changed) or is bucketed, encoded and
// written (encode_and_write); an input that cannot be used becomes a reject of the stage that
// failed (reject) and the next entry goes on.
class CachePreparer {
 public:
  CachePreparer(const Config& cfg, const FrameEncoder& encode, const CaptionEncoder& captions, int worker, int workers,
                const Progress::Options* progress, const ConditionEncoder& condition)
      : cfg_(cfg), d_(cfg.data), encode_(encode), captions_(captions), condition_(condition), worker_(worker),
        workers_(workers), prov_(cfg) {
    VIDIT_CHECK(!appends_condition(cfg.model) || condition, "vidit prepare: model.condition = \"",
                name_of(cfg.model.condition), "\" but no condition encoder was given");
    VIDIT_CHECK(!d_.manifest.empty(), cfg.source, ": vidit prepare needs data.manifest (a .jsonl / .csv file or a folder)");
    VIDIT_CHECK(!d_.cache_dir.empty(), cfg.source, ": vidit prepare needs data.cache_dir (where the cache goes)");
    VIDIT_CHECK(workers >= 1 && worker >= 0 && worker < workers, "vidit prepare: worker ", worker, " of ", workers,
                " is out of range");
    VIDIT_CHECK(d_.text_encoder == TextEncoder::precomputed || captions, "vidit prepare: data.text_encoder = \"",
                d_.text_encoder, "\" but no caption encoder was given");
    VIDIT_CHECK(!d_.split_scenes || d_.clip_seconds > 0, cfg.source, ": data.split_scenes needs data.clip_seconds (the ",
                "length of the clips cut from each scene), e.g. data.clip_seconds = 5");
    buckets_ = make_buckets(cfg.buckets);
    manifest_ = read_manifest(d_.manifest);
    writer_ = std::make_unique<CacheWriter>(d_.cache_dir, worker, d_.shard_mb << 20,
                                            d_.cache_dtype == Precision::bf16 ? at::kBFloat16 : at::kFloat);
    read_records();  // may stop the run (data.on_change = "stop") before anything is changed
    fs::create_directories(d_.cache_dir + "/rejects");
    fs::create_directories(d_.cache_dir + "/done");
    fs::remove(d_.cache_dir + "/done/" + worker_name(worker));

    const int64_t n_all = int64_t(manifest_.entries.size());
    Progress::Options po = progress ? *progress : Progress::Options{};
    if (!progress) po.out = nullptr;  // counted, never shown
    po.label = workers > 1 ? "prepare w" + std::to_string(worker) + " of " + std::to_string(workers) : "prepare";
    po.unit = "video";
    int64_t mine = 0;
    for (size_t i = 0; i < manifest_.entries.size(); ++i) mine += takes(i);
    po.total = mine;
    prog_ = std::make_unique<Progress>(po);
    prog_->count("clips", 0);
    prog_->count("cached", 0);
    board_ = std::make_unique<ProgressBoard>(*prog_, d_.cache_dir, worker, workers, n_all);
    board_->update();
    rejects_ = std::make_unique<RejectLog>(d_.cache_dir + "/rejects/" + worker_name(worker) + ".jsonl", *prog_);
    if (worker == 0)
      for (const auto& r : manifest_.rejected) rejects_->add("", r.where, r.reason, "manifest");
    decode_.target_fps = d_.fps;
    decode_.threads = int(d_.decode_threads);
    decode_.device = parse_decode_device(name_of(d_.decoder), "data.decoder");
    decode_.square_pixels = d_.square_pixels;
    longest_ = *std::max_element(cfg.buckets.frames.begin(), cfg.buckets.frames.end());
    cutting_ = d_.clip_seconds > 0 || d_.split_scenes;
    if (cutting_) start_cutting();
  }

  PrepareReport run() {
    for (size_t i = 0; i < manifest_.entries.size(); ++i) {
      if (!takes(i)) continue;
      ++rep_.entries;
      if (cutting_) cut_video(manifest_.entries[i]);
      else prepare_whole(manifest_.entries[i]);
    }
    finish();
    return rep_;
  }

  // Whether entry i is this worker's: its unit of work (a WebDataset shard, taken whole; else the
  // entry alone), dealt round-robin over the workers.
  bool takes(size_t i) const { return worker_takes(manifest_, i, worker_, workers_); }

 private:
  // What reuse_cached found for a clip's key.
  enum class Reuse { none, kept, reembedded };

  // Many clips per video: the clip settings are checked and the earlier runs' clip plans read.
  void start_cutting() {
    spec_ = ClipSpec{d_.clip_seconds, d_.clip_stride_seconds, d_.max_clips_per_video};
    check_clip_spec(spec_);
    plans_ = read_clip_plans(d_.cache_dir);
    fs::create_directories(d_.cache_dir + "/clips");
    const std::string f = d_.cache_dir + "/clips/" + worker_name(worker_) + ".jsonl";
    plan_log_.open(f, std::ios::app);
    VIDIT_CHECK(plan_log_, "cannot write '", f, "'");
  }

  // Entry `e` as one clip (its manifest window, at most the longest bucket's frames).
  void prepare_whole(const ManifestEntry& e) {
    std::string key = cache_key(e.path, e.start, e.end);
    const nlohmann::json source = source_record(e);
    int64_t rev = 0;
    const char* stage = "decode";  // where a failure happened names its reject category
    try {
      if (const Reuse r = reuse_cached(e, source, e.start, e.end, key, rev); r != Reuse::none) {
        board_->update();
        if (r == Reuse::kept) prog_->skip();
        else prog_->advance();
        return;
      }
      DecodeOptions o = decode_options(e);
      o.max_frames = longest_;
      DecodedVideo v = decode_video(video_file(e), o);
      stage = "bucket";
      // Checked before the caption is embedded, as always: a clip no bucket takes costs no text encode.
      const BucketChoice choice = assign_bucket(buckets_, v.width, v.height, v.frames.size(0), cfg_.buckets.max_upscale);
      VIDIT_CHECK(choice.ok(), choice.reason);
      CacheSample s;
      s.key = key;
      s.rev = rev;
      stage = "caption";
      caption_into(e, s);
      s.meta = {{"source", e.path}, {"caption", e.caption}, {"start", e.start}, {"end", e.end},
                {"source_size", {v.width, v.height}}};
      s.made = prov_.made(e, source.is_null() ? prov_.source(e) : source, e.start, e.end);
      encode_and_write(e, v.frames, v.fps > 0 ? v.fps : 0, s, stage);
    } catch (const std::exception& ex) {
      reject(e, ex, stage);  // one unusable video never stops the run
    }
    board_->update();
    prog_->advance();
  }

  // Entry `e` cut into clips (data.clip_seconds), decoded as a stream unless every clip of an
  // earlier run's plan for it is cached.
  void cut_video(const ManifestEntry& e) {
    const std::string vkey = video_plan_key(prov_.relative(e.path), e, d_);
    const nlohmann::json source = source_record(e);
    bool cached = false;
    try {
      cached = all_clips_cached(e, source, vkey);
    } catch (const std::exception&) {  // the decode below meets the problem and names it
    }
    if (cached) {
      ++rep_.videos_cut;
      board_->update();
      prog_->skip();
      return;
    }
    const char* stage = "caption";
    try {
      CacheSample proto;
      caption_into(e, proto);
      stage = "decode";
      const DecodeOptions o = decode_options(e);
      const double lo = o.start_seconds;
      double hi = o.end_seconds;
      if (const double probed = probe_video_seconds(video_file(e), e.in_shard() ? e.member_offset : 0, e.member_size); probed > 0) hi = std::min(hi, probed);
      ClipCutter cutter(spec_, lo, hi, d_.split_scenes, d_.scene_threshold, longest_);
      std::vector<std::string> keys;
      int64_t usable = 0;  // clips written or found cached
      int64_t width = 0, height = 0;
      double last = -1, interval = 0;  // the latest frame's time and the gap before it
      auto handle = [&](std::vector<ClipCutter::Clip> clips) {
        for (auto& c : clips) {
          std::string key = cache_key(e.path, c.window.start, c.window.end);
          int64_t rev = 0;
          const Reuse reuse = reuse_cached(e, source, c.window.start, c.window.end, key, rev);
          const int64_t index = int64_t(keys.size());
          keys.push_back(key);
          if (reuse != Reuse::none) {
            ++usable;
            continue;
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
            s.made = prov_.made(e, source.is_null() ? prov_.source(e) : source, c.window.start, c.window.end);
            encode_and_write(e, c.frames, fps, s, clip_stage);
            ++usable;
          } catch (const std::exception& ex) {
            // One clip that cannot be used: recorded, and the video's other clips go on.
            rejects_->add(e.path, e.where + " clip " + seconds_range(c.window.start, c.window.end), ex.what(), clip_stage);
          }
        }
        board_->update();
      };
      const DecodedVideo v = decode_video_streaming(video_file(e), o, [&](const at::Tensor& frame, double t) {
        if (last >= 0 && t > last) interval = t - last;
        last = t;
        width = frame.size(1);
        height = frame.size(0);
        handle(cutter.add(frame, t));
        return !cutter.complete();  // every clip cut: the rest of the video is not needed
      });
      const double step = v.fps > 0 ? 1 / v.fps : interval;
      handle(cutter.finish(last + step));
      if (cutter.dense_cuts()) warn_dense_cuts(e, cutter);
      if (keys.empty()) {
        stage = "clips";
        fail("no clip of ", d_.clip_seconds, " s fits ", cutter.cuts().empty() ? std::string("the video") :
             "any scene (" + std::to_string(cutter.cuts().size()) + " scene cuts found)",
             " in ", seconds_range(lo, last + step), "; lower data.clip_seconds",
             cutter.cuts().empty() ? "" : ", or raise data.scene_threshold if these are not real cuts");
      }
      if (usable > 0) ++rep_.videos_cut;
      plan_log_ << nlohmann::json{{"video", vkey}, {"source", e.path}, {"clips", keys}}.dump() << "\n";
      plan_log_.flush();
    } catch (const std::exception& ex) {
      reject(e, ex, stage);
    }
    board_->update();
    prog_->advance();
  }

  // True when every clip of the plan recorded for the video `vkey` is in a finished shard, made
  // from this video with this run's settings: each is kept, or given its new text, without
  // decoding the video. (Otherwise the video is decoded and each clip judged by reuse_cached.)
  bool all_clips_cached(const ManifestEntry& e, const nlohmann::json& source, const std::string& vkey) {
    const auto it = plans_.find(vkey);
    if (it == plans_.end()) return false;
    std::vector<std::pair<std::string, bool>> text_changed;  // each clip, and whether its text changed
    for (const auto& k : it->second) {
      const auto c = writer_->done().find(k);
      if (c == writer_->done().end()) return false;
      const ProvenanceChange ch = prov_.compare(c->second.made, e, source);
      if (!ch.source.empty() || !ch.encode.empty()) return false;
      text_changed.emplace_back(k, ch.recorded ? !ch.text.empty() : stale_caption(e, c->second));
    }
    for (const auto& [k, changed] : text_changed) {
      if (!changed) {
        keep_cached();
        continue;
      }
      try {
        reembed(e, k);
      } catch (const std::exception& ex) {
        rejects_->add(e.path, e.where, std::string("its clip ") + k + " is cached with another caption and its "
                      "latents cannot be read to give it the new one (" + ex.what() + "); delete its shard and "
                      "index part and re-run vidit prepare", "caption");
      }
    }
    return true;
  }

  // The source record of entry `e`'s video (provenance.h), or null when it cannot be read (a
  // clip cached from it is then kept: its video may have been removed after it was encoded).
  nlohmann::json source_record(const ManifestEntry& e) const {
    try {
      return prov_.source(e);
    } catch (const std::exception&) {
      return nullptr;
    }
  }

  // What the cache's entries recorded of how they were made: the lookup of a moved data set's
  // clips (their path under the manifest's root and window), and, with data.on_change = "stop",
  // the check that the clips of this manifest were made with this run's encode settings (the
  // same on every worker: each reads the whole index and the whole manifest).
  void read_records() {
    std::set<std::string> listed;  // this manifest's videos, by recorded path
    for (const ManifestEntry& e : manifest_.entries) listed.insert(prov_.relative(e.path));
    std::map<std::string, int64_t> changed;  // the differing settings -> clips
    for (const auto& [key, c] : writer_->done()) {
      if (c.made.empty()) continue;
      const nlohmann::json made = nlohmann::json::parse(c.made);
      const std::string path = made.at("source").value("path", std::string());
      const auto& w = made.at("window");
      by_identity_[identity(path, w.at(0).get<double>(), w.at(1).get<double>())] = key;
      if (d_.on_change == OnChange::stop && listed.count(path)) {
        const auto diff = encode_differences(made.value("encode", nlohmann::json::object()), prov_.encode());
        if (!diff.empty()) {
          std::string all;
          for (const auto& d : diff) all += (all.empty() ? "" : "; ") + d;
          ++changed[all];
        }
      }
    }
    if (changed.empty()) return;
    std::string what;
    int64_t clips = 0;
    for (const auto& [diff, n] : changed) what += "\n  " + std::to_string(n) + " clip(s): " + diff, clips += n;
    fail("vidit prepare: ", clips, " cached clip(s) of this manifest in ", d_.cache_dir,
         " were made with other settings than this run's (recorded -> now):", what,
         "\nNothing was changed. Set data.on_change = \"reencode\" to encode them again with this run's settings, "
         "or point data.cache_dir at a new cache");
  }

  static std::string identity(const std::string& path, double start, double end) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "|%.17g|%.17g", start, end);
    return path + buf;
  }

  // The cached entry of the clip of `e` in [start, end]: under `key`, or, when a data set moved,
  // under the key of the entry recorded with the same path under the manifest's root and the
  // same window whose video is no longer where it was read (then `key` becomes that key, and
  // the clip keeps it). Null when neither.
  const CachedKey* find_cached(const ManifestEntry& e, double start, double end, std::string& key) const {
    if (auto c = writer_->done().find(key); c != writer_->done().end()) return &c->second;
    const auto moved = by_identity_.find(identity(prov_.relative(e.path), start, end));
    if (moved == by_identity_.end()) return nullptr;
    const CachedKey& c = writer_->done().at(moved->second);
    std::error_code ec;
    if (!c.source.empty() && fs::exists(c.source, ec)) return nullptr;  // another video, still there
    key = moved->second;
    return &c;
  }

  // The clip of entry `e` in [start, end] (key `key`) when a finished shard holds it (found by
  // find_cached, which may change `key`): kept as it is; re-embedded when its caption or text
  // encoder changed; or, when its video was replaced or it was made with other encode settings
  // (data.on_change = "reencode"), Reuse::none with `rev` one above the cached entry's, as also
  // when its latents could not be read to re-embed it. `rev` is 0 for a clip not cached.
  Reuse reuse_cached(const ManifestEntry& e, const nlohmann::json& source, double start, double end, std::string& key,
                     int64_t& rev) {
    rev = 0;
    const CachedKey* cached = find_cached(e, start, end, key);
    if (!cached) return Reuse::none;
    const ProvenanceChange ch = prov_.compare(cached->made, e, source);
    if (!ch.source.empty() || !ch.encode.empty()) {
      // (Other settings reach here only with "reencode": read_records() stops the run otherwise.)
      if (ch.source.empty() && d_.on_change != OnChange::reencode)
        fail("clip ", key, " was made with other settings (", ch.encode.front(), "); set data.on_change = \"reencode\"");
      std::fprintf(stderr, "%s (%s): clip %s is encoded again: %s\n", e.path.c_str(), e.where.c_str(), key.c_str(),
                   !ch.source.empty() ? ("the video was replaced, " + ch.source).c_str()
                                      : ("other settings, " + ch.encode.front()).c_str());
      ++rep_.reencoded;
      prog_->count("re-encoded");
      rev = cached->rev + 1;
      return Reuse::none;
    }
    if (!(ch.recorded ? !ch.text.empty() : stale_caption(e, *cached))) {
      keep_cached();
      return Reuse::kept;
    }
    try {
      reembed(e, key);
      return Reuse::reembedded;
    } catch (const std::exception& ex) {  // its latents unreadable: encoded again from the frames
      std::fprintf(stderr, "warning: %s (%s): clip %s: %s; encoding it again\n", e.path.c_str(), e.where.c_str(),
                   key.c_str(), ex.what());
      rev = cached->rev + 1;
      return Reuse::none;
    }
  }

  void keep_cached() {
    ++rep_.already_done;
    prog_->count("cached");
  }

  // Whether the cached clip `c`'s caption (or precomputed embedding file) is no longer `e`'s.
  bool stale_caption(const ManifestEntry& e, const CachedKey& c) const {
    return d_.text_encoder == TextEncoder::precomputed ? c.text_ref != e.text_embedding
                                                       : c.caption_digest != caption_digest(e.caption);
  }

  // A cached clip whose caption changed gets its new text without its video being decoded or
  // encoded again: its latents are copied from its shard, checked, into a new revision of its
  // key, which replaces the old one in the index.
  void reembed(const ManifestEntry& e, const std::string& key) {
    CacheSample s = read_cached_sample(d_.cache_dir, writer_->cached_entry(key));
    s.text = at::Tensor();
    s.text_ref.clear();
    caption_into(e, s);
    s.meta["caption"] = e.caption;
    if (!s.made.is_null()) s.made["text"] = prov_.text(e);  // an entry without a record keeps none
    ++s.rev;
    writer_->add(s);
    ++rep_.reembedded;
    prog_->count("re-embedded");
  }

  // The caption of entry `e` into `s`: its text embedding, or the precomputed file it names.
  void caption_into(const ManifestEntry& e, CacheSample& s) const {
    if (d_.text_encoder == TextEncoder::precomputed) {
      VIDIT_CHECK(!e.text_embedding.empty(), "no text_embedding file for this clip (data.text_encoder = \"precomputed\")");
      check_text_embedding(e.text_embedding, cfg_.model);
      s.text_ref = e.text_embedding;
    } else {
      s.text = captions_(e.caption);
    }
  }

  // Buckets, encodes and writes the clip `frames` [T, H, W, 3] of entry `e` as `s` (key, text and
  // meta already set); `stage` follows the work for the reject category.
  void encode_and_write(const ManifestEntry& e, const at::Tensor& frames, double fps, CacheSample& s, const char*& stage) {
    stage = "bucket";
    const BucketChoice choice = assign_bucket(buckets_, frames.size(2), frames.size(1), frames.size(0), cfg_.buckets.max_upscale);
    VIDIT_CHECK(choice.ok(), choice.reason);
    const Bucket& b = buckets_[size_t(choice.index)];
    s.bucket = b.name();
    stage = "encode";
    const at::Tensor fit = fit_to_bucket(frames, b);
    std::tie(s.mean, s.std) = encode_(fit, ClipRef{s.key, e.path});
    if (condition_) {  // image-to-video: the condition latent and CLIP features of the same frames
      ClipCondition c = condition_(fit, ClipRef{s.key, e.path});
      s.cond = std::move(c.latent), s.image = std::move(c.image);
    }
    s.meta["fps"] = fps;
    s.meta["frames"] = b.frames;
    stage = "write";
    writer_->add(s);
    ++rep_.written;
    ++rep_.per_bucket[b.name()];
    prog_->count("clips");
    if (fps > 0) rep_.source_seconds += double(b.frames) / fps;
  }

  // The decode of entry `e`: [data]'s settings and the entry's own window.
  DecodeOptions decode_options(const ManifestEntry& e) const {
    DecodeOptions o = decode_;
    if (e.start >= 0) o.start_seconds = e.start;
    if (e.end >= 0) o.end_seconds = e.end;
    if (e.in_shard()) o.byte_offset = e.member_offset, o.byte_size = e.member_size;  // read in place
    return o;
  }

  // The file holding entry `e`'s video: its own, or its WebDataset shard.
  static const std::string& video_file(const ManifestEntry& e) { return e.in_shard() ? e.shard : e.path; }

  // An unusable video is recorded with the category of the stage it failed in ("missing" when a
  // decode failed because the file is not there).
  void reject(const ManifestEntry& e, const std::exception& ex, const char* stage) {
    std::error_code ec;
    const bool missing = std::string(stage) == "decode" && !fs::exists(video_file(e), ec);
    rejects_->add(e.path, e.where, ex.what(), missing ? "missing" : stage);
  }

  void warn_dense_cuts(const ManifestEntry& e, const ClipCutter& cutter) {
    ++rep_.warned_by["scenes"];
    std::fprintf(stderr,
                 "warning: %s (%s): a scene cut on nearly every frame (%zu cuts in the first %lld frames: strobe, "
                 "flicker or noise?); the rest of the video is treated as one scene. Raise data.scene_threshold "
                 "if this video has no such cuts\n",
                 e.path.c_str(), e.where.c_str(), cutter.cuts().size(), static_cast<long long>(cutter.frames_seen()));
  }

  // The last shard, this worker's report (done/w{W}) and, when every worker is done, the merge.
  void finish() {
    writer_->flush();
    rep_.rejected = rejects_->count();
    rep_.rejected_by = rejects_->by_category();
    rep_.seconds = seconds();
    board_->update(/*now=*/true);
    prog_->finish();
    write_file_atomic(d_.cache_dir + "/done/" + worker_name(worker_), report_json(rep_).dump());
    int finished = 0;
    for (int w = 0; w < workers_; ++w) finished += fs::exists(d_.cache_dir + "/done/" + worker_name(w));
    if (finished == workers_) {
      merge_prepared(d_.cache_dir);
      rep_.merged = true;
    }
    rep_.seconds = seconds();
  }

  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

  const Config& cfg_;
  const DataConfig& d_;
  const FrameEncoder& encode_;
  const CaptionEncoder& captions_;
  const ConditionEncoder& condition_;
  const int worker_, workers_;
  Provenance prov_;
  std::map<std::string, std::string> by_identity_;  // recorded path|start|end -> key (moved data sets)
  const std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  std::vector<Bucket> buckets_;
  Manifest manifest_;
  std::unique_ptr<Progress> prog_;
  std::unique_ptr<ProgressBoard> board_;
  std::unique_ptr<RejectLog> rejects_;
  std::unique_ptr<CacheWriter> writer_;
  DecodeOptions decode_;
  int64_t longest_ = 0;  // frames of the longest bucket
  PrepareReport rep_;
  // Cutting clips (data.clip_seconds > 0 or data.split_scenes).
  bool cutting_ = false;
  ClipSpec spec_{};
  std::map<std::string, std::vector<std::string>> plans_;  // earlier runs' clip plans, by video key
  std::ofstream plan_log_;
};

}  // namespace

PrepareReport prepare_cache(const Config& cfg, const FrameEncoder& encode, const CaptionEncoder& captions,
                            int worker, int workers, const Progress::Options* progress,
                            const ConditionEncoder& condition) {
  return CachePreparer(cfg, encode, captions, worker, workers, progress, condition).run();
}

StaleReport stale_entries(const Config& cfg, const std::vector<CacheIndexEntry>& entries) {
  const Manifest manifest = read_manifest(cfg.data.manifest);
  const Provenance prov(cfg);
  const bool precomputed = cfg.data.text_encoder == TextEncoder::precomputed;
  std::map<std::string, const ManifestEntry*> by_key, by_source, by_identity;
  std::set<std::string> repeated;  // videos listed more than once (several windows)
  for (const ManifestEntry& e : manifest.entries) {
    by_key[cache_key(e.path, e.start, e.end)] = &e;
    if (!by_source.emplace(e.path, &e).second) repeated.insert(e.path);
    if (!by_identity.emplace(prov.relative(e.path), &e).second) repeated.insert(prov.relative(e.path));
  }
  StaleReport r;
  for (const CacheIndexEntry& c : entries) {
    const std::string source = c.meta.value("source", std::string());
    const std::string recorded = c.made.is_null() ? std::string() : c.made.at("source").value("path", std::string());
    const ManifestEntry* e = nullptr;
    if (auto k = by_key.find(c.key); k != by_key.end()) e = k->second;
    else if (auto s = by_source.find(source); s != by_source.end() && !repeated.count(source)) e = s->second;
    else if (auto i = by_identity.find(recorded); i != by_identity.end() && !repeated.count(recorded)) e = i->second;
    if (!e) {
      ++r.missing;
      continue;
    }
    std::ostringstream line;
    line << c.key << " " << source << " [" << c.meta.value("start", -1.0) << ", " << c.meta.value("end", -1.0) << "]: ";
    std::vector<std::string> why;
    if (c.made.is_null()) {
      ++r.unrecorded;
      if (precomputed ? c.text_ref != e->text_embedding : c.meta.value("caption", std::string()) != e->caption)
        why.push_back(std::string(precomputed ? "text_embedding file changed" : "caption changed") + " (" + e->where +
                      "); a rerun of vidit prepare gives it the new text without encoding the video again");
    } else {
      nlohmann::json src;
      try {
        src = prov.source(e->path);
      } catch (const std::exception&) {  // not there: the rest of the record is still compared
      }
      const ProvenanceChange ch = prov.compare(c.made.dump(), *e, src);
      if (!ch.source.empty()) why.push_back("the video was replaced: " + ch.source + "; a rerun encodes it again");
      if (!ch.encode.empty()) {
        std::string all;
        for (const auto& d : ch.encode) all += (all.empty() ? "" : "; ") + d;
        why.push_back("made with other settings (" + all + "); a rerun with data.on_change = \"reencode\" encodes it again");
      }
      if (!ch.text.empty())
        why.push_back(ch.text + " (" + e->where + "); a rerun of vidit prepare gives it the new text without encoding "
                      "the video again");
    }
    if (why.empty()) continue;
    for (size_t i = 0; i < why.size(); ++i) line << (i ? "; " : "") << why[i];
    r.stale.push_back(line.str());
  }
  return r;
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
    all.reencoded += j.value("reencoded", int64_t(0));
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
  if (r.reencoded > 0) rows.emplace_back("re-encoded", num(r.reencoded) + " (video replaced, or other settings)");
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

// A cache follows its inputs (prepare/provenance.h), on real videos made by ffmpeg: each entry
// records what made it; a rerun redoes exactly what changed and nothing else (the frame encoder's
// calls are counted):
//  - a video replaced at the same path is encoded again, under its key, at a new revision;
//  - other encode settings (buckets, frame rate) stop the run naming them and change nothing
//    (data.on_change = "stop"), or encode those clips again ("reencode");
//  - a data set moved to another folder (manifest and videos together) finds its entries: nothing
//    encoded, no clip twice in the index;
//  - with data.source_identity = "content", a copy with new times is the same video;
//  - a manifest line repeated is a reject naming the first, and the clip is cached once;
//  - `vidit prepare --verify` names the entries their inputs no longer match;
//  - a cache written before records were kept still loads and is judged by its caption.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <chrono>
#include <iterator>

#include "../../tests/test_util.h"
#include "core/config.h"
#include "loader/latent_cache.h"
#include "prepare/frame_encoder.h"
#include "prepare/manifest.h"
#include "prepare/prepare.h"
#include "prepare/provenance.h"
#include "video/video_test_util.h"
#include "../../tests/mpi_test_util.h"

namespace vidit {
namespace {
namespace fs = std::filesystem;
using video_test::ffmpeg;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Two videos under data/ with a manifest beside them; the cache outside data/.
struct Provenanced {
  test::ScratchDir dir{"provenance"};
  std::string data = dir / "data";
  std::vector<std::string> extra;  // --set overrides of a test

  Provenanced() {
    fs::create_directories(data + "/videos");
    make_video("land.mp4", "64x48", 24);
    make_video("port.mp4", "48x64", 24);
    write_manifest({{"videos/land.mp4", "a grey test card"}, {"videos/port.mp4", "a tall test card"}});
  }
  void make_video(const std::string& name, const std::string& size, int frames, const std::string& source = "testsrc2") const {
    ffmpeg("-f lavfi -i " + source + "=size=" + size + ":rate=8 -frames:v " + std::to_string(frames) +
           " -pix_fmt yuv420p -c:v libx264 " + data + "/videos/" + name);
  }
  void write_manifest(const std::vector<std::pair<std::string, std::string>>& lines) const {
    std::ofstream m(data + "/manifest.jsonl");
    for (const auto& [path, caption] : lines) m << nlohmann::json{{"path", path}, {"caption", caption}}.dump() << "\n";
  }
  std::vector<std::string> sets() const {
    std::vector<std::string> out = {
        "model.in_channels=12", "model.out_channels=12", "model.patch=[1,2,2]", "data.source=\"cache\"",
        "data.manifest=\"" + data + "/manifest.jsonl\"", "data.cache_dir=\"" + (dir / "cache") + "\"",
        "data.codec=\"demo\"", "data.cache_dtype=\"fp32\"", "data.decode_threads=1", "buckets.resolutions=[48]",
        "buckets.aspect_ratios=[1.3333333, 0.75]", "buckets.frames=[5, 9]", "buckets.frame_stride=4",
        "buckets.multiple=8"};
    out.insert(out.end(), extra.begin(), extra.end());
    return out;
  }
  Config config() const { return load_config("", sets()); }
  // prepare_cache with this config's encoders, counting the frame encoder's calls.
  PrepareReport prepare(int* encodes) const {
    const Config cfg = config();
    const FrameEncoder encode = make_frame_encoder(cfg);
    *encodes = 0;
    return prepare_cache(
        cfg, [&](const at::Tensor& f, const ClipRef& clip) { ++*encodes; return encode(f, clip); },
        make_caption_encoder(cfg));
  }
  // index.jsonl's lines.
  std::vector<nlohmann::json> index() const {
    std::vector<nlohmann::json> out;
    std::ifstream in(dir / "cache/index.jsonl");
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  nlohmann::json entry_of(const std::string& video) const {
    for (const auto& j : index())
      if (fs::path(j["meta"]["source"].get<std::string>()).filename() == video) return j;
    return nullptr;
  }
  // `vidit prepare --verify` on this config: exit status, output in *out.
  int verify(std::string* out) const {
    std::string cmd = std::string(VIDIT_BINARY) + " prepare --verify";
    for (const auto& s : sets()) cmd += " --set '" + s + "'";
    auto r = test::run_process(cmd);
    *out = r.output;
    return r.status;
  }
};

TEST(CacheProvenance, EachEntryRecordsWhatMadeIt) {
  SKIP_WITHOUT_DECODING();
  Provenanced p;
  int encodes = 0;
  ASSERT_EQ(p.prepare(&encodes).written, 2);
  const nlohmann::json land = p.entry_of("land.mp4");
  ASSERT_FALSE(land.is_null());
  const nlohmann::json& made = land.at("made");
  EXPECT_EQ(made["source"]["path"], "videos/land.mp4") << "relative to the manifest's folder";
  EXPECT_EQ(made["source"]["size"].get<int64_t>(), int64_t(fs::file_size(p.data + "/videos/land.mp4")));
  EXPECT_GT(made["source"]["mtime_ns"].get<int64_t>(), 0);
  EXPECT_FALSE(made["source"].contains("xxh64")) << "data.source_identity = \"stat\" reads no bytes for it";
  EXPECT_EQ(made["window"], nlohmann::json::array({-1.0, -1.0}));
  EXPECT_EQ(made["encode"]["data.codec"], "demo");
  EXPECT_EQ(made["encode"]["buckets.resolutions"], nlohmann::json::array({48}));
  EXPECT_EQ(made["encode"]["data.cache_dtype"], "fp32");
  EXPECT_EQ(made["text"]["encoder"], "demo " + std::to_string(p.config().model.text_len) + "x" +
                                         std::to_string(p.config().model.text_dim));
  EXPECT_EQ(made["text"]["caption"].get<std::string>().size(), 16u);
  // Nothing changed: nothing is done again, and --verify finds nothing stale.
  const PrepareReport again = p.prepare(&encodes);
  EXPECT_EQ(encodes, 0);
  EXPECT_EQ(again.already_done, 2);
  std::string out;
  EXPECT_EQ(p.verify(&out), 0) << out;
  EXPECT_NE(out.find("0 failed their checksum, 0 stale, 0 not in the manifest"), std::string::npos) << out;
}

TEST(CacheProvenance, AVideoReplacedAtItsPathIsEncodedAgain) {
  SKIP_WITHOUT_DECODING();
  Provenanced p;
  int encodes = 0;
  ASSERT_EQ(p.prepare(&encodes).written, 2);
  const nlohmann::json before = p.entry_of("land.mp4");
  // Another picture, the same size in pixels and frames: only the file says it is another video.
  fs::remove(p.data + "/videos/land.mp4");
  p.make_video("land.mp4", "64x48", 24, "mandelbrot");
  std::string out;
  EXPECT_EQ(p.verify(&out), 5) << out;
  EXPECT_NE(out.find("land.mp4 [-1, -1]: the video was replaced: its size changed"), std::string::npos) << out;
  EXPECT_EQ(out.find("port.mp4"), std::string::npos) << out;

  const PrepareReport again = p.prepare(&encodes);
  EXPECT_EQ(encodes, 1) << "only the replaced video is encoded";
  EXPECT_EQ(again.reencoded, 1);
  EXPECT_EQ(again.already_done, 1);
  const nlohmann::json after = p.entry_of("land.mp4");
  EXPECT_EQ(after["key"], before["key"]) << "the clip keeps its key";
  EXPECT_EQ(after.value("rev", 0), 1);
  EXPECT_NE(after["checksum"], before["checksum"]) << "the latents are the new video's";
  EXPECT_EQ(after["made"]["source"]["size"].get<int64_t>(), int64_t(fs::file_size(p.data + "/videos/land.mp4")));
  EXPECT_EQ(p.index().size(), 2u) << "no clip twice";
  EXPECT_EQ(p.verify(&out), 0) << out;
}

TEST(CacheProvenance, OtherEncodeSettingsStopTheRunOrAreEncodedAgain) {
  SKIP_WITHOUT_DECODING();
  Provenanced p;
  int encodes = 0;
  ASSERT_EQ(p.prepare(&encodes).written, 2);
  const std::string index_before = read_file(p.dir / "cache/index.jsonl");
  p.extra = {"data.fps=4"};
  try {
    p.prepare(&encodes);
    FAIL() << "a cache made at the source rate was extended at 4 fps";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("2 clip(s): data.fps: 0.0 -> 4.0"), std::string::npos) << what;
    EXPECT_NE(what.find("data.on_change = \"reencode\""), std::string::npos) << what;
    EXPECT_NE(what.find("Nothing was changed"), std::string::npos) << what;
  }
  EXPECT_EQ(encodes, 0);
  EXPECT_EQ(read_file(p.dir / "cache/index.jsonl"), index_before) << "the index changed";
  std::string out;
  EXPECT_EQ(p.verify(&out), 5) << out;
  EXPECT_NE(out.find("made with other settings (data.fps: 0.0 -> 4.0)"), std::string::npos) << out;

  // The same change, with data.on_change = "reencode": both clips encoded again, once.
  p.extra = {"data.fps=4", "data.on_change=\"reencode\""};
  const PrepareReport again = p.prepare(&encodes);
  EXPECT_EQ(encodes, 2);
  EXPECT_EQ(again.reencoded, 2);
  for (const auto& j : p.index()) {
    EXPECT_EQ(j.value("rev", 0), 1) << j.dump();
    EXPECT_EQ(j["made"]["encode"]["data.fps"], 4.0) << j.dump();
    EXPECT_EQ(j["meta"]["fps"], 4.0) << j.dump();
  }
  EXPECT_EQ(p.index().size(), 2u);
  EXPECT_EQ(p.prepare(&encodes).already_done, 2);
  EXPECT_EQ(encodes, 0);

  // A bucket setting is named the same way.
  p.extra = {"data.fps=4", "buckets.resolutions=[40]"};
  try {
    p.prepare(&encodes);
    FAIL() << "new buckets over a cache made with others";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("buckets.resolutions: [48] -> [40]"), std::string::npos) << e.what();
  }
}

TEST(CacheProvenance, AMovedDataSetFindsItsEntries) {
  SKIP_WITHOUT_DECODING();
  Provenanced p;
  int encodes = 0;
  ASSERT_EQ(p.prepare(&encodes).written, 2);
  const auto before = p.index();
  const nlohmann::json land_key = p.entry_of("land.mp4")["key"];
  // The data set moves (a rename keeps the files' times, as mv and rsync -a do).
  const std::string moved = p.dir / "elsewhere";
  fs::rename(p.data, moved);
  p.data = moved;
  const PrepareReport again = p.prepare(&encodes);
  EXPECT_EQ(encodes, 0) << "a moved video was encoded again";
  EXPECT_EQ(again.already_done, 2);
  EXPECT_EQ(again.written, 0);
  const auto after = p.index();
  ASSERT_EQ(after.size(), 2u) << "a clip is in the index twice";
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i]["key"], before[i]["key"]);
  std::string out;
  EXPECT_EQ(p.verify(&out), 0) << out;
  EXPECT_NE(out.find("0 stale, 0 not in the manifest"), std::string::npos) << out;
  // A caption changed after the move: re-embedded under the clip's own key.
  p.write_manifest({{"videos/land.mp4", "a red car"}, {"videos/port.mp4", "a tall test card"}});
  const PrepareReport third = p.prepare(&encodes);
  EXPECT_EQ(encodes, 0);
  EXPECT_EQ(third.reembedded, 1);
  ASSERT_EQ(p.index().size(), 2u);
  EXPECT_EQ(p.entry_of("land.mp4")["key"], land_key);
  EXPECT_EQ(p.entry_of("land.mp4")["meta"]["caption"], "a red car");
}

TEST(CacheProvenance, AMovedDataSetOfCutClipsFindsItsEntries) {
  SKIP_WITHOUT_DECODING();
  Provenanced p;
  p.extra = {"data.clip_seconds=1"};
  int encodes = 0;
  const PrepareReport first = p.prepare(&encodes);
  ASSERT_EQ(first.written, 6) << "three 1 s clips of each 3 s video";
  const auto before = p.index();
  const std::string moved = p.dir / "elsewhere";
  fs::rename(p.data, moved);
  p.data = moved;
  const PrepareReport again = p.prepare(&encodes);
  EXPECT_EQ(encodes, 0) << "a moved clip was encoded again";
  EXPECT_EQ(again.already_done, 6);
  const auto after = p.index();
  ASSERT_EQ(after.size(), before.size()) << "a clip is in the index twice";
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i]["key"], before[i]["key"]);
}

TEST(CacheProvenance, ByContentACopyWithNewTimesIsTheSameVideo) {
  SKIP_WITHOUT_DECODING();
  Provenanced p;
  p.extra = {"data.source_identity=\"content\""};
  int encodes = 0;
  ASSERT_EQ(p.prepare(&encodes).written, 2);
  EXPECT_EQ(p.entry_of("land.mp4")["made"]["source"]["xxh64"].get<std::string>().size(), 16u);
  // A copy (new modification times) of the whole data set, the original removed.
  const std::string copy = p.dir / "copied";
  fs::copy(p.data, copy, fs::copy_options::recursive);
  fs::remove_all(p.data);
  p.data = copy;
  fs::last_write_time(copy + "/videos/port.mp4", fs::file_time_type::clock::now() + std::chrono::hours(1));
  EXPECT_EQ(p.prepare(&encodes).already_done, 2);
  EXPECT_EQ(encodes, 0) << "a copy was encoded again";
  std::string out;
  EXPECT_EQ(p.verify(&out), 0) << out;
  // The same new time on a cache that recorded no hash (data.source_identity = "stat"): another video.
  Provenanced q;
  ASSERT_EQ(q.prepare(&encodes).written, 2);
  fs::last_write_time(q.data + "/videos/port.mp4", fs::file_time_type::clock::now() + std::chrono::hours(1));
  EXPECT_EQ(q.verify(&out), 5) << out;
  EXPECT_NE(out.find("port.mp4 [-1, -1]: the video was replaced: its modification time changed"), std::string::npos) << out;
  EXPECT_EQ(q.prepare(&encodes).reencoded, 1);
  EXPECT_EQ(encodes, 1);
}

TEST(CacheProvenance, ARepeatedManifestLineIsARejectAndTheClipIsCachedOnce) {
  SKIP_WITHOUT_DECODING();
  Provenanced p;
  p.write_manifest({{"videos/land.mp4", "a grey test card"}, {"videos/port.mp4", "a tall test card"},
                    {"videos/../videos/land.mp4", "the same clip again"}});
  const Manifest m = read_manifest(p.data + "/manifest.jsonl");
  ASSERT_EQ(m.entries.size(), 2u);
  ASSERT_EQ(m.rejected.size(), 1u);
  EXPECT_NE(m.rejected[0].where.find("manifest.jsonl:3"), std::string::npos) << m.rejected[0].where;
  EXPECT_NE(m.rejected[0].reason.find("repeats"), std::string::npos) << m.rejected[0].reason;
  EXPECT_NE(m.rejected[0].reason.find("manifest.jsonl:1"), std::string::npos) << m.rejected[0].reason;
  int encodes = 0;
  const PrepareReport r = p.prepare(&encodes);
  EXPECT_EQ(r.written, 2);
  EXPECT_EQ(r.rejected_by.at("manifest"), 1);
  EXPECT_EQ(p.index().size(), 2u);
}

TEST(CacheProvenance, ACacheWrittenBeforeRecordsWereKeptIsJudgedByItsCaption) {
  SKIP_WITHOUT_DECODING();
  Provenanced p;
  int encodes = 0;
  ASSERT_EQ(p.prepare(&encodes).written, 2);
  // Take the records out of every index file: a cache as earlier versions wrote it.
  for (const auto& f : fs::recursive_directory_iterator(p.dir / "cache")) {
    if (f.path().extension() != ".jsonl" || f.path().string().find("/rejects") != std::string::npos) continue;
    std::ifstream in(f.path());
    std::string all;
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      j.erase("made");
      all += j.dump() + "\n";
    }
    in.close();
    std::ofstream(f.path()) << all;
  }
  LatentCache cache(p.dir / "cache");
  ASSERT_EQ(cache.size(), 2);
  EXPECT_TRUE(cache.entry(0).made.is_null());
  EXPECT_NO_THROW(cache.load(0));
  // Other settings cannot be told from an entry that recorded none: it is kept (no stop).
  p.extra = {"data.fps=4"};
  EXPECT_EQ(p.prepare(&encodes).already_done, 2);
  EXPECT_EQ(encodes, 0);
  // Its caption is still compared.
  p.extra = {};
  p.write_manifest({{"videos/land.mp4", "a red car"}, {"videos/port.mp4", "a tall test card"}});
  std::string out;
  EXPECT_EQ(p.verify(&out), 5) << out;
  EXPECT_NE(out.find("land.mp4 [-1, -1]: caption changed"), std::string::npos) << out;
  EXPECT_NE(out.find("2 samples recorded nothing of how they were made"), std::string::npos) << out;
  const PrepareReport r = p.prepare(&encodes);
  EXPECT_EQ(r.reembedded, 1);
  EXPECT_EQ(encodes, 0);
  EXPECT_EQ(p.index().size(), 2u);
}

}  // namespace
}  // namespace vidit

// What `vidit prepare` shows while it works and at the end, on real small videos made by the
// ffmpeg CLI (good ones, a corrupt one, one too short for every bucket, a missing one, a broken
// manifest line): the periodic plain lines of a log (not a terminal), the final line, worker 0's
// totals across workers read from their progress files, and the summary table with each reject
// under its category.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "../../tests/test_util.h"
#include "core/config.h"
#include "prepare/frame_encoder.h"
#include "prepare/prepare.h"
#include "video/video_test_util.h"

namespace vidit {
namespace {
namespace fs = std::filesystem;
using video_test::ffmpeg;

struct SmallSet {
  test::ScratchDir dir{"prepare_progress"};
  std::string config;

  SmallSet() {
    const std::string v = dir / "videos";
    fs::create_directories(v);
    const std::string x264 = " -pix_fmt yuv420p -c:v libx264 ";
    ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=8 -frames:v 12" + x264 + v + "/land.mp4");
    ffmpeg("-f lavfi -i testsrc2=size=48x64:rate=8 -frames:v 12" + x264 + v + "/port.mp4");
    ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=8 -frames:v 12" + x264 + v + "/land2.mp4");
    ffmpeg("-f lavfi -i testsrc2=size=64x48:rate=8 -frames:v 3" + x264 + v + "/short.mp4");  // too short: bucket
    {
      std::string noise(5000, '\0');
      for (size_t i = 0; i < noise.size(); ++i) noise[i] = char((i * 2654435761u) >> 13);
      std::ofstream(v + "/corrupt.mp4", std::ios::binary) << noise;  // decode
    }
    // Worker 0 of 2 takes land, corrupt, land2 (and the broken line); worker 1 port, short, missing.
    std::ofstream m(dir / "manifest.jsonl");
    for (std::string f : {"land.mp4", "port.mp4", "corrupt.mp4", "short.mp4", "land2.mp4", "missing.mp4"})
      m << nlohmann::json{{"path", "videos/" + f}, {"caption", "clip " + f}}.dump() << "\n";
    m << "{broken json\n";
    config = dir / "prepare.toml";
    std::ofstream(config) << "[model]\nin_channels = 12\nout_channels = 12\npatch = [1, 2, 2]\n"
                          << "[data]\nsource = \"cache\"\nmanifest = \"" << (dir / "manifest.jsonl") << "\"\n"
                          << "cache_dir = \"" << (dir / "cache") << "\"\ncodec = \"demo\"\nshard_mb = 1\n"
                          << "cache_dtype = \"fp32\"\ndecode_threads = 1\n"
                          << "[buckets]\nresolutions = [48]\naspect_ratios = [1.3333333, 0.75]\n"
                          << "frames = [5, 9]\nframe_stride = 4\nmultiple = 8\n";
  }
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text)
    if (c == '\n')
      out.push_back(cur), cur.clear();
    else
      cur += c;
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The value in the summary table's row `name`, or "" when there is no such row.
std::string row(const std::string& table, const std::string& name) {
  std::smatch m;
  const std::regex re("\n  " + name + " +([^\n]+)\n");
  return std::regex_search(table, m, re) ? m[1].str() : "";
}

TEST(PrepareProgress, WorkerZeroShowsTheTotalsOfAllWorkers) {
  SKIP_WITHOUT_DECODING();
  SmallSet s;
  const Config cfg = load_config(s.config);
  std::FILE* log = std::tmpfile();
  Progress::Options po;
  po.out = log;
  po.plain_seconds = 0;  // a line after every video
  // Worker 1 first, to the end; then worker 0, which reads worker 1's progress file.
  const PrepareReport r1 = prepare_cache(cfg, make_frame_encoder(cfg), make_caption_encoder(cfg), 1, 2, &po);
  EXPECT_EQ(r1.written, 1);
  EXPECT_EQ(r1.rejected_by, (std::map<std::string, int64_t>{{"bucket", 1}, {"missing", 1}}));
  EXPECT_FALSE(r1.merged);
  std::rewind(log);
  const auto w1 = lines_of(read_text("/proc/self/fd/" + std::to_string(fileno(log))));
  ASSERT_EQ(w1.size(), 4u) << "a line per video and a final one";
  EXPECT_EQ(w1[0].rfind("[prepare w1 of 2] 1/3 videos 33% | clips 1, cached 0 | ", 0), 0u) << w1[0];
  EXPECT_EQ(w1[3].rfind("[prepare w1 of 2] 3/3 videos 100% | clips 1, cached 0, rejected 2 (bucket 1, missing 1) | ", 0), 0u)
      << w1[3];
  EXPECT_NE(w1[3].find("| took "), std::string::npos) << w1[3];
  EXPECT_TRUE(fs::exists(cfg.data.cache_dir + "/progress/w001.json"));

  std::FILE* log0 = std::tmpfile();
  po.out = log0;
  const PrepareReport r0 = prepare_cache(cfg, make_frame_encoder(cfg), make_caption_encoder(cfg), 0, 2, &po);
  std::fflush(log0);
  const auto w0 = lines_of(read_text("/proc/self/fd/" + std::to_string(fileno(log0))));
  std::fclose(log);
  std::fclose(log0);
  EXPECT_TRUE(r0.merged);
  EXPECT_EQ(r0.rejected_by, (std::map<std::string, int64_t>{{"decode", 1}, {"manifest", 1}}));
  ASSERT_EQ(w0.size(), 4u);
  const std::string& last = w0.back();
  EXPECT_EQ(last.rfind("[prepare w0 of 2] 3/3 videos 100% | clips 2, cached 0, rejected 2 (manifest 1, decode 1) | ", 0), 0u)
      << last;
  EXPECT_NE(last.find("| all 2 workers: 6/6 videos 100%, clips 3, rejected 4, "), std::string::npos) << last;
  EXPECT_EQ(last.find("not heard from"), std::string::npos) << last;
  // From its first line on (the totals are refreshed every few seconds, and at the end).
  EXPECT_NE(w0[0].find("| all 2 workers: "), std::string::npos) << w0[0];

  const std::string table = prepare_summary(prepare_totals(cfg.data.cache_dir, 2), "summary of all 2 workers");
  EXPECT_EQ(table.rfind("summary of all 2 workers\n", 0), 0u) << table;
  EXPECT_EQ(row(table, "clips written"), "3") << table;
  EXPECT_EQ(row(table, "clips in 9x40x56"), "2") << table;
  EXPECT_EQ(row(table, "clips in 9x56x40"), "1") << table;
  EXPECT_EQ(row(table, "rejected: decode"), "1") << table;
  EXPECT_EQ(row(table, "rejected: bucket"), "1") << table;
  EXPECT_EQ(row(table, "rejected: missing"), "1") << table;
  EXPECT_EQ(row(table, "rejected: manifest"), "1") << table;
  EXPECT_EQ(row(table, "rejected"), "4") << table;
  EXPECT_EQ(row(table, "videos"), "6") << table;

  // Each line of the merged rejects.jsonl names its category.
  std::map<std::string, std::string> category;
  for (const auto& l : lines_of(read_text(cfg.data.cache_dir + "/rejects.jsonl"))) {
    const auto j = nlohmann::json::parse(l);
    category[fs::path(j["input"].get<std::string>()).filename().string()] = j["category"];
  }
  EXPECT_EQ(category["corrupt.mp4"], "decode");
  EXPECT_EQ(category["short.mp4"], "bucket");
  EXPECT_EQ(category["missing.mp4"], "missing");
  EXPECT_EQ(category[""], "manifest");
}

TEST(PrepareProgress, ALogGetsPeriodicLinesAndTheSummaryTable) {
  SKIP_WITHOUT_DECODING();
  SmallSet s;
  const std::string log = s.dir / "prepare.log";
  // stdout is a file, not a terminal: plain lines, here one a video (VIDIT_PROGRESS_SECONDS=0).
  const std::string cmd = "VIDIT_PROGRESS_SECONDS=0 " + std::string(VIDIT_BINARY) + " prepare --config " + s.config;
  ASSERT_EQ(std::system((cmd + " > " + log + " 2>&1").c_str()), 0) << read_text(log);
  std::string text = read_text(log);
  EXPECT_EQ(text.find('\r'), std::string::npos) << "no in-place redraws in a log";
  std::vector<std::string> progress;
  for (const auto& l : lines_of(text))
    if (l.rfind("[prepare] ", 0) == 0) progress.push_back(l);
  ASSERT_EQ(progress.size(), 7u) << text;
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(progress[size_t(i)].rfind("[prepare] " + std::to_string(i + 1) + "/6 videos", 0), 0u) << progress[size_t(i)];
  EXPECT_EQ(progress[6].rfind("[prepare] 6/6 videos 100% | clips 3, cached 0, rejected 4 (manifest 1, decode 1, bucket 1, "
                              "missing 1) | ", 0), 0u) << progress[6];
  EXPECT_NE(progress[2].find(" left"), std::string::npos) << "time left while running: " << progress[2];
  const std::string table = text.substr(text.find("\nsummary\n"));
  EXPECT_EQ(row(table, "clips written"), "3") << table;
  EXPECT_EQ(row(table, "already cached"), "0") << table;
  EXPECT_EQ(row(table, "rejected: decode"), "1") << "the corrupt video: " << table;
  EXPECT_EQ(row(table, "rejected: bucket"), "1") << table;
  EXPECT_EQ(row(table, "rejected: missing"), "1") << table;
  EXPECT_EQ(row(table, "rejected"), "4") << table;
  EXPECT_NE(row(table, "rate").find("videos/s"), std::string::npos) << table;
  EXPECT_NE(row(table, "time").find(" s"), std::string::npos) << table;

  // A rerun: the good videos count as cached (not in the rate), the bad ones are tried again.
  ASSERT_EQ(std::system((cmd + " > " + log + " 2>&1").c_str()), 0) << read_text(log);
  text = read_text(log);
  EXPECT_NE(text.find("[prepare] 6/6 videos 100% | clips 0, cached 3, rejected 4 "), std::string::npos) << text;
  EXPECT_EQ(row(text.substr(text.find("\nsummary\n")), "already cached"), "3") << text;
}

}  // namespace
}  // namespace vidit

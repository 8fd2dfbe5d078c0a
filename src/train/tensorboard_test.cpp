// Tests of the native TensorBoard event writer: CRC-32C, the files read back by TensorBoard's own
// reader (tests/reference/tensorboard_reader.py), resumed runs, and I/O failures that must only warn.
#include "train/tensorboard.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../../tests/test_util.h"
#include "core/error.h"
#include "train/metrics.h"

namespace vidit {
namespace {

using json = nlohmann::json;

// Runs TensorBoard's reader on `dir`: its JSON, or sets `skip` when Python or tensorboard is missing.
// A reader that runs and fails is a test failure (ADD_FAILURE), not a skip.
json read_with_tensorboard(const std::string& dir, std::string& skip) {
#ifndef VIDIT_PYTHON
  skip = "built without VIDIT_PYTHON (no Python to run TensorBoard's reader)";
  return {};
#else
  const std::string err_path = dir + ".reader_stderr";
  const std::string cmd = std::string(VIDIT_PYTHON) + " " + VIDIT_SOURCE_DIR +
                          "/tests/reference/tensorboard_reader.py " + dir + " 2>" + err_path;
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    skip = "cannot start " + cmd;
    return {};
  }
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  std::ifstream ef(err_path);
  const std::string err((std::istreambuf_iterator<char>(ef)), std::istreambuf_iterator<char>());
  std::filesystem::remove(err_path);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 3 || code == 127) {  // the package, or the interpreter itself, is missing
    skip = "TensorBoard's reader cannot run (" + std::string(VIDIT_PYTHON) + "): " + err.substr(0, 400);
    return {};
  }
  if (code != 0) {
    ADD_FAILURE() << "tests/reference/tensorboard_reader.py failed (exit " << code << "): " << err;
    return {};
  }
  return json::parse(out);
#endif
}

#define READ_WITH_TENSORBOARD(var, dir)          \
  std::string skip_reason_;                      \
  const json var = read_with_tensorboard(dir, skip_reason_); \
  if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;  \
  ASSERT_FALSE(var.is_null())

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

TEST(TensorBoardCrc, KnownVectors) {
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283u);  // the standard CRC-32C check value
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::vector<uint8_t> zeros(32, 0), ones(32, 0xff);  // RFC 3720 (iSCSI) B.4 test patterns
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  // The masked form: rotate right by 15, plus a constant.
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c(digits.data(), digits.size()), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoardWriter, TensorBoardReadsEverythingWritten) {
  test::ScratchDir dir("tb_all");
  const std::string run = dir / "run";
  const double wall0 = 1.7e9;

  // Scalars: several tags (one with '/' and 'x'), several steps, values that float32 rounds.
  const std::vector<std::string> tags = {"eval/loss", "loss/bucket_16x20", "lr"};
  auto value = [](size_t t, int64_t step) { return 0.1 * double(step + 1) / double(t + 3) + 1e-9 * double(t); };
  // A histogram of values spread over signs and magnitudes, zero and a non-finite value included.
  std::vector<double> hist_values;
  for (int i = 0; i < 200; ++i) hist_values.push_back(std::sin(0.37 * i) * std::pow(10.0, (i % 7) - 3));
  hist_values.push_back(0.0);
  hist_values.push_back(NAN);
  // An image: 3 rows x 4 columns, RGB.
  const int H = 3, W = 4, C = 3;
  std::vector<uint8_t> pixels(size_t(H) * W * C);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = uint8_t((i * 37 + 11) % 256);
  const std::string png = encode_png(pixels.data(), H, W, C);
  const std::string text = "# Run notes\n**bold**, `code` and ünïcödé: 1 < 2";
  StepMetrics m;
  m.step = 7, m.loss = 0.25, m.grad_norm = 1.5, m.lr = 3e-4, m.tokens_per_s = 12345, m.samples_per_s = 2.5;
  m.tflops = 0.75, m.step_seconds = 0.4, m.data_wait_s = 0.01, m.comm_wait_s = 0.02;  // mfu unknown (-1)
  {
    TensorBoardWriter w(run);
    ASSERT_TRUE(w.ok());
    for (int64_t step = 0; step < 5; ++step)
      for (size_t t = 0; t < tags.size(); ++t) w.add_scalar(tags[t], step, value(t, step), wall0 + double(step));
    w.add_histogram("weights/blocks.0", 3, hist_values);
    w.add_histogram("weights/tensor", 4, at::arange(-5, 6, at::kFloat).reshape({11, 1}));
    w.add_image("samples/frame0", 2, png, H, W, C);
    w.add_text("config", 0, text);
    w.add_step_metrics(m);
  }  // the destructor flushes
  ASSERT_EQ(event_files(run).size(), 1u);

  // Our own reader sees the scalars (it is what last_step_written() relies on).
  const std::vector<TensorBoardEvent> own = read_tensorboard_events(event_files(run)[0]);
  size_t own_scalars = 0;
  for (const auto& e : own) own_scalars += e.kind == TensorBoardEvent::Kind::scalar;
  EXPECT_EQ(own_scalars, tags.size() * 5 + 9);  // 9 from the step metrics (no mfu, no slowest score)
  EXPECT_EQ(last_step_written(run), 7);

  READ_WITH_TENSORBOARD(r, run);
  EXPECT_EQ(r["file_version"].get<double>(), 2.0);
  // Scalars: every tag, every step once, each value as float32.
  for (size_t t = 0; t < tags.size(); ++t) {
    SCOPED_TRACE(tags[t]);
    ASSERT_TRUE(r["scalars"].contains(tags[t]));
    const json& rows = r["scalars"][tags[t]];
    ASSERT_EQ(rows.size(), 5u);
    for (int64_t step = 0; step < 5; ++step) {
      EXPECT_EQ(rows[step][0].get<int64_t>(), step);
      EXPECT_EQ(float(rows[step][1].get<double>()), float(value(t, step)));
    }
  }
  const std::vector<std::pair<std::string, double>> step_tags = {
      {"train/loss", 0.25},         {"train/grad_norm", 1.5},     {"train/lr", 3e-4},
      {"perf/tokens_per_s", 12345}, {"perf/samples_per_s", 2.5},  {"perf/tflops", 0.75},
      {"time/step_seconds", 0.4},   {"time/data_wait_s", 0.01},   {"time/comm_wait_s", 0.02}};
  for (const auto& [tag, v] : step_tags) {
    SCOPED_TRACE(tag);
    const json& rows = r["scalars"][tag];
    ASSERT_FALSE(rows.empty());
    EXPECT_EQ(rows.back()[0].get<int64_t>(), 7);
    EXPECT_EQ(float(rows.back()[1].get<double>()), float(v));
  }
  EXPECT_FALSE(r["scalars"].contains("perf/mfu"));           // unknown peak: not written
  EXPECT_FALSE(r["scalars"].contains("perf/slowest_score"));  // one process: not written

  // Histogram: the statistics of the finite values, and every bucket holding exactly the values in
  // [previous limit, its limit).
  {
    ASSERT_TRUE(r["histograms"].contains("weights/blocks.0"));
    const json& rows = r["histograms"]["weights/blocks.0"];
    ASSERT_EQ(rows.size(), 1u);
    const json& h = rows[0];
    EXPECT_EQ(h["step"].get<int64_t>(), 3);
    std::vector<double> finite;
    for (double v : hist_values)
      if (std::isfinite(v)) finite.push_back(v);
    double sum = 0, sq = 0;
    for (double v : finite) sum += v, sq += v * v;
    EXPECT_EQ(h["num"].get<double>(), double(finite.size()));
    EXPECT_EQ(h["min"].get<double>(), *std::min_element(finite.begin(), finite.end()));
    EXPECT_EQ(h["max"].get<double>(), *std::max_element(finite.begin(), finite.end()));
    EXPECT_DOUBLE_EQ(h["sum"].get<double>(), sum);
    EXPECT_DOUBLE_EQ(h["sum_squares"].get<double>(), sq);
    const auto limits = h["bucket_limit"].get<std::vector<double>>();
    const auto counts = h["bucket"].get<std::vector<double>>();
    ASSERT_EQ(limits.size(), counts.size());
    ASSERT_FALSE(limits.empty());
    EXPECT_LT(limits.size(), 600u);  // runs of empty buckets are merged
    double total = 0, prev = -INFINITY;
    for (size_t i = 0; i < limits.size(); ++i) {
      EXPECT_GT(limits[i], prev);
      const double in = double(std::count_if(finite.begin(), finite.end(),
                                             [&](double v) { return v >= prev && v < limits[i]; }));
      EXPECT_EQ(counts[i], in) << "bucket " << i << " [" << prev << ", " << limits[i] << ")";
      total += counts[i], prev = limits[i];
    }
    EXPECT_EQ(total, double(finite.size()));
  }
  {
    ASSERT_TRUE(r["histograms"].contains("weights/tensor"));
    const json& h = r["histograms"]["weights/tensor"][0];
    EXPECT_EQ(h["step"].get<int64_t>(), 4);
    EXPECT_EQ(h["num"].get<double>(), 11.0);
    EXPECT_EQ(h["min"].get<double>(), -5.0);
    EXPECT_EQ(h["max"].get<double>(), 5.0);
    EXPECT_EQ(h["sum"].get<double>(), 0.0);
    EXPECT_EQ(h["sum_squares"].get<double>(), 110.0);
  }

  // Image: its size, and (when Pillow is there to decode it) every pixel.
  ASSERT_TRUE(r["images"].contains("samples/frame0"));
  const json& im = r["images"]["samples/frame0"][0];
  EXPECT_EQ(im["step"].get<int64_t>(), 2);
  EXPECT_EQ(im["width"].get<int>(), W);
  EXPECT_EQ(im["height"].get<int>(), H);
  EXPECT_EQ(im["png_size"].get<size_t>(), png.size());
  if (!im["pixels"].is_null()) {
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x)
        for (int c = 0; c < C; ++c)
          EXPECT_EQ(im["pixels"][y][x][c].get<int>(), pixels[(size_t(y) * W + x) * C + c]) << y << "," << x << "," << c;
  }

  // As TensorBoard's plugins see the run (the dashboards): every tag under its plugin.
  const json& plugins = r["plugins"];
  for (const std::string& tag : {"eval/loss", "loss/bucket_16x20", "lr", "train/loss", "time/comm_wait_s"})
    EXPECT_NE(std::find(plugins["scalars"].begin(), plugins["scalars"].end(), tag), plugins["scalars"].end()) << tag;
  EXPECT_EQ(plugins["histograms"], json::array({"weights/blocks.0", "weights/tensor"}));
  EXPECT_EQ(plugins["images"], json::array({"samples/frame0"}));
  EXPECT_EQ(plugins["text"], json::array({"config"}));

  // Text: filed under the text plugin, the markdown byte for byte.
  EXPECT_EQ(r["text_plugin_tags"], json::array({"config"}));
  ASSERT_TRUE(r["texts"].contains("config"));
  EXPECT_EQ(r["texts"]["config"].size(), 1u);
  EXPECT_EQ(r["texts"]["config"][0][0].get<int64_t>(), 0);
  EXPECT_EQ(r["texts"]["config"][0][1].get<std::string>(), text);
}

TEST(TensorBoardWriter, FlushesOnItsOwnAndOnRequest) {
  test::ScratchDir dir("tb_flush");
  TensorBoardOptions o;
  o.flush_seconds = 0.05;
  TensorBoardWriter w(dir.path(), o);
  ASSERT_TRUE(w.ok());
  w.add_scalar("a", 1, 1.0);
  // The background thread writes it within a few periods, while the writer stays open.
  bool seen = false;
  for (int i = 0; i < 200 && !seen; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    seen = !read_tensorboard_events(w.path()).empty();
  }
  EXPECT_TRUE(seen);

  o.flush_seconds = 3600;  // only flush() or the destructor write
  test::ScratchDir dir2("tb_flush2");
  TensorBoardWriter w2(dir2.path(), o);
  w2.add_scalar("b", 2, 2.0);
  EXPECT_TRUE(read_tensorboard_events(w2.path()).empty());
  w2.flush();
  const auto events = read_tensorboard_events(w2.path());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].tag, "b");
  EXPECT_EQ(events[0].step, 2);
  EXPECT_EQ(events[0].value, 2.0);
}

TEST(TensorBoardWriter, ThreadsWriteWholeRecords) {
  test::ScratchDir dir("tb_threads");
  TensorBoardOptions o;
  o.flush_seconds = 0.001;
  std::string path;
  {
    TensorBoardWriter w(dir.path(), o);
    path = w.path();
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&w, t] {
        for (int64_t s = 0; s < 250; ++s) w.add_scalar("thread" + std::to_string(t), s, double(s));
      });
    for (auto& th : threads) th.join();
  }
  const auto events = read_tensorboard_events(path);
  EXPECT_EQ(events.size(), 1000u);
}

TEST(TensorBoardWriter, ResumedRunWritesEachStepOnce) {
  test::ScratchDir dir("tb_resume");
  EXPECT_EQ(last_step_written(dir.path()), -1);
  EXPECT_EQ(last_step_written(dir / "missing"), -1);
  // The first run logs steps 0..5 and is killed; it had checkpointed step 3.
  {
    TensorBoardWriter w(dir.path());
    for (int64_t s = 0; s <= 5; ++s) w.add_scalar("train/loss", s, 10.0 + double(s));
  }
  EXPECT_EQ(last_step_written(dir.path()), 5);
  // The resumed run trains steps 4..9 again from the checkpoint; steps 4 and 5 are in the first file.
  const int64_t resumed_from = 3;
  TensorBoardOptions o;
  o.first_step = std::max(resumed_from + 1, last_step_written(dir.path()) + 1);
  EXPECT_EQ(o.first_step, 6);
  {
    TensorBoardWriter w(dir.path(), o);
    for (int64_t s = resumed_from + 1; s < 10; ++s) w.add_scalar("train/loss", s, 20.0 + double(s));
  }
  ASSERT_EQ(event_files(dir.path()).size(), 2u);  // a new file for the new run
  EXPECT_EQ(last_step_written(dir.path()), 9);

  READ_WITH_TENSORBOARD(r, dir.path());
  const json& rows = r["scalars"]["train/loss"];
  ASSERT_EQ(rows.size(), 10u);
  for (int64_t s = 0; s < 10; ++s) {
    EXPECT_EQ(rows[s][0].get<int64_t>(), s);
    EXPECT_EQ(rows[s][1].get<double>(), (s <= 5 ? 10.0 : 20.0) + double(s));
  }
}

TEST(TensorBoardWriter, TornLastRecordIsDropped) {
  test::ScratchDir dir("tb_torn");
  std::string path;
  {
    TensorBoardWriter w(dir.path());
    path = w.path();
    for (int64_t s = 0; s < 3; ++s) w.add_scalar("x", s, double(s));
  }
  const std::string copy = dir / "copy";
  std::filesystem::copy_file(path, copy);
  // A run killed while writing: the last record loses its final bytes.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  auto events = read_tensorboard_events(path);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events.back().step, 1);
  EXPECT_EQ(last_step_written(dir.path()), 1);
  // A flipped byte inside the last record's data: its CRC no longer matches, the reading stops there.
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-6, std::ios::end);
    f.put('\x7f');
  }
  events = read_tensorboard_events(copy);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events.back().step, 1);
  EXPECT_THROW(read_tensorboard_events(dir / "no_such_file"), Error);
}

TEST(TensorBoardWriterFailure, DirectoryThatCannotBeCreatedOnlyWarns) {
  // Tests run as root, where permissions do not stop writes: a path below a regular file cannot
  // be a directory for anyone.
  test::ScratchDir dir("tb_nodir");
  const std::string file = dir / "plain_file";
  std::ofstream(file) << "x";
  testing::internal::CaptureStderr();
  {
    TensorBoardWriter w(file + "/tb");
    EXPECT_FALSE(w.ok());
    EXPECT_NO_THROW(w.add_scalar("a", 1, 1.0));
    EXPECT_NO_THROW(w.add_histogram("h", 1, std::vector<double>{1.0, 2.0}));
    EXPECT_NO_THROW(w.add_text("t", 1, "text"));
    EXPECT_NO_THROW(w.flush());
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(file + "/tb"), std::string::npos) << err;
  EXPECT_NE(err.find(std::strerror(ENOTDIR)), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << "one warning, not one per call: " << err;
}

TEST(TensorBoardWriterFailure, DiskFullOnlyWarns) {
  testing::internal::CaptureStderr();
  {
    TensorBoardOptions o;
    o.flush_seconds = 0;  // write through: every call meets the full disk
    TensorBoardWriter w(TensorBoardWriter::ToFile{"/dev/full"}, o);
    EXPECT_FALSE(w.ok());
    for (int64_t s = 0; s < 3; ++s) EXPECT_NO_THROW(w.add_scalar("a", s, 1.0));
    EXPECT_NO_THROW(w.flush());
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("/dev/full"), std::string::npos) << err;
  EXPECT_NE(err.find(std::strerror(ENOSPC)), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

TEST(TensorBoardWriterFailure, FileThatCannotBeOpenedOnlyWarns) {
  testing::internal::CaptureStderr();
  {
    TensorBoardWriter w(TensorBoardWriter::ToFile{"/proc/vidit_no_such_dir/events"});
    EXPECT_FALSE(w.ok());
    EXPECT_NO_THROW(w.add_scalar("a", 0, 1.0));
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("/proc/vidit_no_such_dir/events"), std::string::npos) << err;
}

TEST(TensorBoardPng, EncodesAndRejectsBadSizes) {
  const std::vector<uint8_t> gray(6, 128);
  const std::string png = encode_png(gray.data(), 2, 3, 1);
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_THROW(encode_png(gray.data(), 2, 3, 5), Error);
  EXPECT_THROW(encode_png(gray.data(), 0, 3, 1), Error);
}

}  // namespace
}  // namespace vidit

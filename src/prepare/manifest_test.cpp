// Manifests: JSON lines, CSV with quoting, and a folder with sidecar captions; bad lines are
// rejected with their line and reason while the rest are read.
#include "prepare/manifest.h"

#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "../../tests/test_util.h"

namespace vidit {
namespace {

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(Manifest, JsonLinesWithBadLinesRejected) {
  test::ScratchDir dir("manifest_jsonl");
  write(dir / "m.jsonl",
        "{\"path\": \"a.mp4\", \"caption\": \"a cat\"}\n"
        "\n"
        "{\"path\": \"/abs/b.mkv\", \"caption\": \"a dog\", \"start\": 1.5, \"end\": 4, \"text_embedding\": \"e/b.safetensors\"}\n"
        "{not json\n"
        "{\"path\": \"c.mp4\"}\n"
        "{\"path\": \"d.mp4\", \"caption\": \"x\", \"start\": 5, \"end\": 2}\n"
        "{\"path\": \"e.mp4\", \"caption\": \"x\", \"start\": \"soon\"}\n");
  Manifest m = read_manifest(dir / "m.jsonl");
  ASSERT_EQ(m.entries.size(), 2u);
  EXPECT_EQ(m.entries[0].path, dir / "a.mp4");
  EXPECT_EQ(m.entries[0].start, -1);
  EXPECT_EQ(m.entries[1].path, "/abs/b.mkv");
  EXPECT_EQ(m.entries[1].start, 1.5);
  EXPECT_EQ(m.entries[1].end, 4);
  EXPECT_EQ(m.entries[1].text_embedding, dir / "e/b.safetensors");
  ASSERT_EQ(m.rejected.size(), 4u);
  EXPECT_EQ(m.rejected[0].where, dir / "m.jsonl:4");
  EXPECT_NE(m.rejected[1].reason.find("caption"), std::string::npos) << m.rejected[1].reason;
  EXPECT_EQ(m.rejected[2].where, dir / "m.jsonl:6");
  EXPECT_NE(m.rejected[2].reason.find("not after start"), std::string::npos) << m.rejected[2].reason;
  EXPECT_EQ(m.rejected[3].where, dir / "m.jsonl:7");
}

TEST(Manifest, CsvWithQuotes) {
  test::ScratchDir dir("manifest_csv");
  write(dir / "m.csv",
        "caption,path,start,end\n"
        "\"a cat, sitting\",v/a.mp4,,\n"
        "\"she said \"\"hi\"\"\",b.mp4,0.5,2\n"
        "oops,c.mp4,abc,\n"
        "\"open quote,d.mp4,,\n");
  Manifest m = read_manifest(dir / "m.csv");
  ASSERT_EQ(m.entries.size(), 2u);
  EXPECT_EQ(m.entries[0].caption, "a cat, sitting");
  EXPECT_EQ(m.entries[0].path, dir / "v/a.mp4");
  EXPECT_EQ(m.entries[1].caption, "she said \"hi\"");
  EXPECT_EQ(m.entries[1].start, 0.5);
  ASSERT_EQ(m.rejected.size(), 2u);
  EXPECT_EQ(m.rejected[0].where, dir / "m.csv:4");
  EXPECT_EQ(m.rejected[1].where, dir / "m.csv:5");
  write(dir / "bad.csv", "file,text\nx.mp4,y\n");
  try {
    read_manifest(dir / "bad.csv");
    FAIL() << "a CSV without a path column was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'path' column"), std::string::npos) << e.what();
  }
}

TEST(Manifest, FolderWithSidecarCaptions) {
  test::ScratchDir dir("manifest_dir");
  std::filesystem::create_directories(dir / "sub");
  write(dir / "a.mp4", "");
  write(dir / "a.txt", "  a red square  \n");
  write(dir / "sub/b.WEBM", "");
  write(dir / "sub/b.txt", "a blue circle");
  write(dir / "c.mkv", "");  // no caption
  write(dir / "notes.md", "ignored");
  Manifest m = read_manifest(dir.path());
  ASSERT_EQ(m.entries.size(), 2u);
  EXPECT_EQ(m.entries[0].caption, "a red square");
  EXPECT_EQ(m.entries[1].path, dir / "sub/b.WEBM");
  ASSERT_EQ(m.rejected.size(), 1u);
  EXPECT_NE(m.rejected[0].reason.find("c.txt"), std::string::npos);
  EXPECT_THROW(read_manifest(dir / "missing.jsonl"), Error);
  write(dir / "m.yaml", "x");
  EXPECT_THROW(read_manifest(dir / "m.yaml"), Error);
}

}  // namespace
}  // namespace vidit

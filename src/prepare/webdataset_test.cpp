// WebDataset shards: brace patterns, tar members and their offsets (ustar, GNU long names, pax),
// grouping into samples with .txt / .json captions, every reject by name, and shards cut short
// or damaged (the samples before the damage kept, one reject naming where it broke). The tars are
// written by the system's GNU tar from real files, except where a header GNU tar never writes
// for small files (a pax size record) is built by hand.
#include "prepare/webdataset.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "../../tests/test_util.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;

void write(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Bytes that are not text, `n` of them, different for each `seed`.
std::string blob(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = char((i * 131 + size_t(seed) * 17 + i / 7) & 0xFF);
  return s;
}

// Archives `members` (paths under dir/src, in this order) into `tar` with GNU tar.
void make_tar(const test::ScratchDir& dir, const std::string& tar, const std::string& options,
              const std::vector<std::string>& members) {
  std::string cmd = "tar " + options + " --owner=0 --group=0 -C '" + dir / "src" + "' -cf '" + tar + "'";
  for (const auto& m : members) cmd += " '" + m + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// --- hand-built archives, for headers GNU tar does not write for small files ---

std::string octal(int64_t v, int width) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%0*llo", width, static_cast<unsigned long long>(v));
  return buf;
}

std::string header(const std::string& name, int64_t size_field, char type) {
  std::string h(512, '\0');
  h.replace(0, name.size(), name);
  h.replace(100, 7, octal(0644, 7));
  h.replace(124, 11, octal(size_field, 11));
  h.replace(136, 11, octal(0, 11));
  h[156] = type;
  h.replace(257, 8, std::string("ustar\0" "00", 8));
  h.replace(148, 8, "        ");
  int64_t sum = 0;
  for (unsigned char c : h) sum += c;
  h.replace(148, 6, octal(sum, 6));
  h[154] = '\0';
  return h;
}

std::string padded(std::string data) { return data + std::string((512 - data.size() % 512) % 512, '\0'); }

std::string pax_record(const std::string& key, const std::string& value) {
  const std::string body = " " + key + "=" + value + "\n";
  size_t len = body.size() + 1;
  while (std::to_string(len).size() + body.size() != len) ++len;
  return std::to_string(len) + body;
}

// ---------------------------------------------------------------------------------------------

TEST(WebDataset, ExpandsRangesKeepingZeroPadding) {
  EXPECT_EQ(expand_shard_pattern("shards/{00000..00003}.tar"),
            (std::vector<std::string>{"shards/00000.tar", "shards/00001.tar", "shards/00002.tar", "shards/00003.tar"}));
  EXPECT_EQ(expand_shard_pattern("{098..101}"), (std::vector<std::string>{"098", "099", "100", "101"}));
  EXPECT_EQ(expand_shard_pattern("{8..11}"), (std::vector<std::string>{"8", "9", "10", "11"}));
  EXPECT_EQ(expand_shard_pattern("{0..6..3}"), (std::vector<std::string>{"0", "3", "6"}));
  EXPECT_EQ(expand_shard_pattern("{5..5}"), (std::vector<std::string>{"5"}));
  EXPECT_EQ(expand_shard_pattern("/data/one.tar"), (std::vector<std::string>{"/data/one.tar"}));
  EXPECT_EQ(expand_shard_pattern("s3://b/{000000..009999}.tar").size(), 10000u);
}

TEST(WebDataset, ExpandsListsAndSeveralBracesLeftToRight) {
  EXPECT_EQ(expand_shard_pattern("{a,b,c}.tar"), (std::vector<std::string>{"a.tar", "b.tar", "c.tar"}));
  EXPECT_EQ(expand_shard_pattern("{x,y}/{0..1}-{p,q}.tar"),
            (std::vector<std::string>{"x/0-p.tar", "x/0-q.tar", "x/1-p.tar", "x/1-q.tar", "y/0-p.tar", "y/0-q.tar",
                                      "y/1-p.tar", "y/1-q.tar"}));
  EXPECT_EQ(expand_shard_pattern("{a,}z"), (std::vector<std::string>{"az", "z"}));
  EXPECT_EQ(expand_shard_pattern("{a,b{00..01}}"), (std::vector<std::string>{"a", "b00", "b01"}));
}

TEST(WebDataset, RejectsMalformedPatternsNamingThem) {
  for (const std::string& bad : std::vector<std::string>{"s/{00..03.tar", "s/a}.tar", "s/{}.tar", "s/{abc}.tar", "s/{3..1}.tar",
                                "s/{a..c}.tar", "s/{1..2..0}.tar", "s/{1..2..3..4}.tar", "{0..99999999}",
                                "{a{1,2}}", "{0..9999}{0..9999}"}) {
    const std::string msg = test::message_of([&] { expand_shard_pattern(bad); });
    EXPECT_TRUE(contains(msg, "shard pattern '" + bad + "'")) << bad << ": " << msg;
  }
  EXPECT_TRUE(contains(test::message_of([] { expand_shard_pattern("{3..1}"); }), "descending"));
  EXPECT_TRUE(contains(test::message_of([] { expand_shard_pattern("a{00..03"); }), "never closed"));
  EXPECT_TRUE(contains(test::message_of([] { expand_shard_pattern("{abc}"); }), "neither a range nor a list"));
}

TEST(WebDataset, ListsUstarMembersAtTheirOffsets) {
  test::ScratchDir dir("wds_ustar");
  // A path over 100 characters that ustar stores as prefix + name.
  const std::string deep = std::string(70, 'd') + "/" + std::string(60, 'n') + ".mp4";
  ASSERT_GT(deep.size(), 100u);
  const std::vector<std::pair<std::string, std::string>> files = {
      {"00000.mp4", blob(1000, 1)}, {"00000.txt", "a cat\n"}, {"empty.txt", ""},
      {"sub/00001.mp4", blob(512, 2)}, {deep, blob(77, 3)}};
  for (const auto& [name, bytes] : files) write(dir / ("src/" + name), bytes);
  // "sub" is archived as a directory entry followed by its file: the directory is not a member.
  make_tar(dir, dir / "s.tar", "--format=ustar", {"00000.mp4", "00000.txt", "empty.txt", "sub", deep});

  const std::vector<TarMember> m = list_tar_members(dir / "s.tar");
  ASSERT_EQ(m.size(), files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    EXPECT_EQ(m[i].name, files[i].first);
    EXPECT_EQ(m[i].size, int64_t(files[i].second.size()));
    EXPECT_EQ(m[i].offset % 512, 0);
    EXPECT_EQ(read_tar_member(dir / "s.tar", m[i]), files[i].second) << m[i].name;
  }
  EXPECT_EQ(m[0].offset, 512);
  EXPECT_TRUE(scan_tar(dir / "s.tar").error.empty());
}

TEST(WebDataset, ReadsGnuLongNamesAndPaxHeaders) {
  test::ScratchDir dir("wds_long");
  const std::string long_name = std::string(120, 'k') + ".mp4";  // one component: no ustar split
  write(dir / ("src/" + long_name), blob(600, 4));
  write(dir / "src/short.txt", "hello\n");
  // GNU: a '././@LongLink' member ('L') carries the name.
  make_tar(dir, dir / "gnu.tar", "--format=gnu", {long_name, "short.txt"});
  // pax: an 'x' header's path record carries it; --pax-option comment= adds a global 'g' header.
  make_tar(dir, dir / "pax.tar", "--format=pax --pax-option=comment=hello", {long_name, "short.txt"});
  for (const std::string& tar : {dir / "gnu.tar", dir / "pax.tar"}) {
    const std::vector<TarMember> m = list_tar_members(tar);
    ASSERT_EQ(m.size(), 2u) << tar;
    EXPECT_EQ(m[0].name, long_name);
    EXPECT_EQ(read_tar_member(tar, m[0]), blob(600, 4));
    EXPECT_EQ(m[1].name, "short.txt");
    EXPECT_EQ(read_tar_member(tar, m[1]), "hello\n");
  }
  EXPECT_TRUE(contains(slurp(dir / "gnu.tar"), "././@LongLink"));
  EXPECT_TRUE(contains(slurp(dir / "pax.tar"), "comment=hello"));
}

TEST(WebDataset, HardLinksAreNotMembers) {
  test::ScratchDir dir("wds_link");
  write(dir / "src/a.mp4", blob(100, 1));
  write(dir / "src/a.txt", "a caption");
  // A file named twice is archived once, then as a hard link ('1') to itself: not a second member.
  make_tar(dir, dir / "s.tar", "--format=ustar", {"a.mp4", "a.txt", "a.mp4"});
  ASSERT_TRUE(contains(slurp(dir / "s.tar"), std::string("a.mp4\0", 6)));
  const std::vector<TarMember> m = list_tar_members(dir / "s.tar");
  ASSERT_EQ(m.size(), 2u);
  std::vector<WebDatasetReject> rejects;
  EXPECT_EQ(read_webdataset_shard(dir / "s.tar", &rejects).size(), 1u);
  EXPECT_TRUE(rejects.empty());
}

TEST(WebDataset, PaxSizeRecordOverridesTheHeader) {
  test::ScratchDir dir("wds_paxsize");
  // The ustar size field says 0; the pax size record says 5 (as for members over 8 GiB).
  const std::string pax = pax_record("size", "5") + pax_record("path", "clips/a.txt");
  const std::string tar = header("PaxHeaders/a", int64_t(pax.size()), 'x') + padded(pax) +
                          header("a.txt", 0, '0') + padded("hello") + std::string(1024, '\0');
  write(dir / "a.tar", tar);
  const std::vector<TarMember> m = list_tar_members(dir / "a.tar");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].name, "clips/a.txt");
  EXPECT_EQ(m[0].size, 5);
  EXPECT_EQ(read_tar_member(dir / "a.tar", m[0]), "hello");

  // A malformed pax record is damage, named.
  write(dir / "b.tar", header("PaxHeaders/a", 9, 'x') + padded("99 path=\n") + header("a.txt", 0, '0') +
                           std::string(1024, '\0'));
  EXPECT_TRUE(contains(test::message_of([&] { list_tar_members(dir / "b.tar"); }), "malformed"));

  // A zero block followed by a header is damage, not the end of the archive.
  write(dir / "c.tar", header("a.txt", 5, '0') + padded("hello") + std::string(512, '\0') +
                           header("b.txt", 0, '0') + std::string(1024, '\0'));
  const TarScan s = scan_tar(dir / "c.tar");
  ASSERT_EQ(s.members.size(), 1u);
  EXPECT_TRUE(contains(s.error, "followed by data")) << s.error;
  EXPECT_EQ(s.broken_member, "a.txt");
}

TEST(WebDataset, GroupsMembersIntoSamplesWithTxtAndJsonCaptions) {
  test::ScratchDir dir("wds_group");
  write(dir / "src/00000.mp4", blob(900, 5));
  write(dir / "src/00000.txt", "a cat on a mat \n\n\t");
  write(dir / "src/00000.json", "{\"caption\": \"not this one\", \"url\": \"http://x\"}");
  write(dir / "src/00001.MP4", blob(300, 6));
  write(dir / "src/00001.json", "{\"caption\": \"a dog\\n\", \"width\": 640}");
  write(dir / "src/sub/abc.x.mp4", blob(20, 7));
  write(dir / "src/sub/abc.txt", "caf\xc3\xa9 \xe7\x8c\xab \xf0\x9f\x90\xb1");
  write(dir / "src/00002.webm", blob(10, 8));
  write(dir / "src/00002.jpg", blob(10, 9));  // other extensions are ignored
  write(dir / "src/00002.TXT", "a bird");
  write(dir / "src/README", "no extension: no key");
  write(dir / "src/00003.mkv", blob(10, 10));
  write(dir / "src/00003.json", "{\"caption\": \"a fish\"}");
  make_tar(dir, dir / "s.tar", "--format=ustar",
           {"00000.mp4", "00000.txt", "00000.json", "00001.MP4", "00001.json", "sub/abc.x.mp4", "sub/abc.txt",
            "00002.webm", "00002.jpg", "00002.TXT", "README", "00003.json", "00003.mkv"});

  std::vector<WebDatasetReject> rejects;
  const std::vector<WebDatasetSample> s = read_webdataset_shard(dir / "s.tar", &rejects);
  EXPECT_TRUE(rejects.empty()) << rejects[0].member << ": " << rejects[0].reason;
  ASSERT_EQ(s.size(), 5u);
  const std::vector<std::string> keys = {"00000", "00001", "sub/abc", "00002", "00003"};
  const std::vector<std::string> videos = {"00000.mp4", "00001.MP4", "sub/abc.x.mp4", "00002.webm", "00003.mkv"};
  const std::vector<std::string> captions = {"a cat on a mat", "a dog", "caf\xc3\xa9 \xe7\x8c\xab \xf0\x9f\x90\xb1",
                                             "a bird", "a fish"};
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(s[i].shard, dir / "s.tar");
    EXPECT_EQ(s[i].key, keys[i]);
    EXPECT_EQ(s[i].video.name, videos[i]);
    EXPECT_EQ(s[i].caption, captions[i]);
    EXPECT_EQ(read_tar_member(dir / "s.tar", s[i].video), slurp(dir / ("src/" + videos[i])));
  }
  // Without a reject list the samples are the same.
  EXPECT_EQ(read_webdataset_shard(dir / "s.tar", nullptr).size(), 5u);
}

TEST(WebDataset, RejectsEachBadKeyByNameAndKeepsTheRest) {
  test::ScratchDir dir("wds_rejects");
  std::vector<std::string> order;
  auto add = [&](const std::string& name, const std::string& bytes) {
    write(dir / ("src/" + name), bytes);
    order.push_back(name);
  };
  add("good.mp4", blob(50, 1));
  add("good.txt", "fine");
  add("novideo.txt", "a caption with no video");
  add("nocap.mp4", blob(50, 2));
  add("two.mp4", blob(50, 3));
  add("two.x.mp4", blob(50, 4));
  add("two.txt", "two videos");
  add("badutf.mp4", blob(50, 5));
  add("badutf.txt", "bad \xff\xfe bytes");
  add("overlong.mp4", blob(50, 6));
  add("overlong.txt", "slash \xc0\xaf");
  add("surrogate.mp4", blob(50, 7));
  add("surrogate.json", "{\"caption\": \"\xed\xa0\x80\"}");
  add("badjson.mp4", blob(50, 8));
  add("badjson.json", "{not json");
  add("nofield.mp4", blob(50, 9));
  add("nofield.json", "{\"text\": \"x\"}");
  add("numcap.mp4", blob(50, 10));
  add("numcap.json", "{\"caption\": 3}");
  add("empty.mp4", blob(50, 11));
  add("empty.txt", " \n\n");
  add("good2.mov", blob(50, 12));
  add("good2.json", "{\"caption\": \"also fine\"}");
  make_tar(dir, dir / "s.tar", "--format=pax", order);

  std::vector<WebDatasetReject> rejects;
  const std::vector<WebDatasetSample> s = read_webdataset_shard(dir / "s.tar", &rejects);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].key, "good");
  EXPECT_EQ(s[1].key, "good2");
  EXPECT_EQ(s[1].caption, "also fine");

  struct Want {
    std::string member, phrase;
  };
  const std::vector<Want> want = {
      {"novideo.txt", "has no video member"},   {"nocap.mp4", "has no caption"},
      {"two.x.mp4", "two video members, 'two.mp4' and 'two.x.mp4'"},
      {"badutf.txt", "not valid UTF-8 (at byte 4)"}, {"overlong.txt", "not valid UTF-8"},
      {"surrogate.json", "not valid UTF-8"},    {"badjson.json", "not valid JSON"},
      {"nofield.json", "no string field \"caption\""}, {"numcap.json", "no string field \"caption\""},
      {"empty.txt", "empty caption"}};
  ASSERT_EQ(rejects.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(rejects[i].shard, dir / "s.tar");
    EXPECT_EQ(rejects[i].member, want[i].member);
    EXPECT_TRUE(contains(rejects[i].reason, want[i].phrase)) << rejects[i].reason;
    EXPECT_TRUE(contains(rejects[i].reason, want[i].member)) << rejects[i].reason;
  }
}

TEST(WebDataset, TwoCaptionsOfOneKindRejectTheKey) {
  test::ScratchDir dir("wds_twocap");
  write(dir / "src/a.mp4", blob(10, 1));
  write(dir / "src/a.txt", "one");
  write(dir / "src/a.TXT", "two");  // extensions are compared in lower case: a second caption
  write(dir / "src/A.txt", "unused: another key");
  write(dir / "src/b/a.txt", "unused: another key");
  make_tar(dir, dir / "s.tar", "--format=ustar", {"a.mp4", "a.txt", "A.txt", "b/a.txt", "a.TXT"});
  std::vector<WebDatasetReject> rejects;
  EXPECT_TRUE(read_webdataset_shard(dir / "s.tar", &rejects).empty());
  ASSERT_EQ(rejects.size(), 3u);  // a (two captions), A (no video), b/a (no video)
  EXPECT_EQ(rejects[0].member, "a.TXT");
  EXPECT_TRUE(contains(rejects[0].reason, "two caption members, 'a.txt' and 'a.TXT'")) << rejects[0].reason;
  EXPECT_TRUE(contains(rejects[1].reason, "key 'A' has no video")) << rejects[1].reason;
  EXPECT_TRUE(contains(rejects[2].reason, "key 'b/a' has no video")) << rejects[2].reason;
}

// Four members: 00000.mp4, 00000.txt, 00001.mp4, 00001.txt.
void make_two_samples(const test::ScratchDir& dir, const std::string& tar) {
  write(dir / "src/00000.mp4", blob(1000, 1));
  write(dir / "src/00000.txt", "first");
  write(dir / "src/00001.mp4", blob(3000, 2));
  write(dir / "src/00001.txt", "second");
  make_tar(dir, tar, "--format=ustar", {"00000.mp4", "00000.txt", "00001.mp4", "00001.txt"});
}

TEST(WebDataset, TruncatedShardKeepsTheSamplesBeforeTheCut) {
  test::ScratchDir dir("wds_cut");
  const std::string tar = dir / "s.tar";
  make_two_samples(dir, tar);
  const std::vector<TarMember> whole = list_tar_members(tar);
  ASSERT_EQ(whole.size(), 4u);
  fs::resize_file(tar, uint64_t(whole[2].offset + whole[2].size / 2));  // inside 00001.mp4's data

  const std::string msg = test::message_of([&] { list_tar_members(tar); });
  for (const std::string& part : std::vector<std::string>{tar, "00001.mp4", "truncated or damaged", "re-download or re-create"})
    EXPECT_TRUE(contains(msg, part)) << msg;
  const TarScan scan = scan_tar(tar);
  EXPECT_EQ(scan.members.size(), 2u);
  EXPECT_EQ(scan.broken_member, "00001.mp4");

  std::vector<WebDatasetReject> rejects;
  const std::vector<WebDatasetSample> s = read_webdataset_shard(tar, &rejects);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].key, "00000");
  EXPECT_EQ(s[0].caption, "first");
  EXPECT_EQ(read_tar_member(tar, s[0].video), blob(1000, 1));
  ASSERT_EQ(rejects.size(), 1u);
  EXPECT_EQ(rejects[0].shard, tar);
  EXPECT_EQ(rejects[0].member, "00001.mp4");
  EXPECT_TRUE(contains(rejects[0].reason, "truncated or damaged")) << rejects[0].reason;

  // Cut inside the second member (the first sample's caption): no sample, and one reject only,
  // naming the caption member (not also "00000.mp4 has no caption").
  make_two_samples(dir, tar);
  fs::resize_file(tar, uint64_t(whole[1].offset + 2));
  rejects.clear();
  EXPECT_TRUE(read_webdataset_shard(tar, &rejects).empty());
  ASSERT_EQ(rejects.size(), 1u);
  EXPECT_EQ(rejects[0].member, "00000.txt");

  // Cut on a block boundary right after a member: every sample is whole, but the missing
  // end-of-archive block still says the shard is short.
  make_two_samples(dir, tar);
  fs::resize_file(tar, uint64_t(whole[3].offset + 512));
  rejects.clear();
  EXPECT_EQ(read_webdataset_shard(tar, &rejects).size(), 2u);
  ASSERT_EQ(rejects.size(), 1u);
  EXPECT_EQ(rejects[0].member, "00001.txt");
  EXPECT_TRUE(contains(rejects[0].reason, "without the end-of-archive block")) << rejects[0].reason;

  // A member read past the end of the file says so.
  EXPECT_TRUE(contains(test::message_of([&] { read_tar_member(tar, {"late.txt", 1 << 20, 10}); }),
                       "member 'late.txt' needs bytes"));
}

TEST(WebDataset, BadHeaderChecksumIsDamageNamedByTheLastGoodMember) {
  test::ScratchDir dir("wds_checksum");
  const std::string tar = dir / "s.tar";
  make_two_samples(dir, tar);
  const std::vector<TarMember> whole = list_tar_members(tar);
  std::string bytes = slurp(tar);
  bytes[size_t(whole[2].offset - 512)] ^= 0x01;  // the first letter of 00001.mp4's name
  write(tar, bytes);

  const std::string msg = test::message_of([&] { list_tar_members(tar); });
  for (const std::string& part : std::vector<std::string>{tar, "bad checksum", "after member '00000.txt'", "re-download or re-create"})
    EXPECT_TRUE(contains(msg, part)) << msg;
  std::vector<WebDatasetReject> rejects;
  const std::vector<WebDatasetSample> s = read_webdataset_shard(tar, &rejects);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].key, "00000");
  ASSERT_EQ(rejects.size(), 1u);
  EXPECT_EQ(rejects[0].member, "00000.txt");
  EXPECT_TRUE(contains(rejects[0].reason, "bad checksum")) << rejects[0].reason;
}

TEST(WebDataset, TextMembersAreCappedAndMissingShardsThrow) {
  test::ScratchDir dir("wds_cap");
  write(dir / "src/big.txt", std::string(100, 'x'));
  make_tar(dir, dir / "s.tar", "--format=ustar", {"big.txt"});
  const std::vector<TarMember> m = list_tar_members(dir / "s.tar");
  ASSERT_EQ(m.size(), 1u);
  const std::string msg = test::message_of([&] { read_tar_member(dir / "s.tar", m[0], 10); });
  EXPECT_TRUE(contains(msg, "member 'big.txt'") && contains(msg, "100 bytes")) << msg;
  EXPECT_EQ(read_tar_member(dir / "s.tar", m[0], 100), std::string(100, 'x'));

  EXPECT_THROW(list_tar_members(dir / "absent.tar"), SystemError);
  EXPECT_THROW(read_webdataset_shard(dir / "absent.tar", nullptr), SystemError);
  EXPECT_TRUE(contains(test::message_of([&] { scan_tar(dir / "absent.tar"); }), "absent.tar"));
  EXPECT_TRUE(contains(test::message_of([&] { scan_tar(dir.path()); }), "is a folder")) << dir.path();
}

}  // namespace
}  // namespace vidit

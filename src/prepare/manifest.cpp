#include "prepare/manifest.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "prepare/webdataset.h"

namespace vidit {
namespace fs = std::filesystem;
namespace {

std::string resolve(const std::string& p, const fs::path& base) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  return (base / p).lexically_normal().string();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  size_t i = s.find_first_not_of(" \t");
  return i == std::string::npos ? std::string() : s.substr(i);
}

// Adds `e` or records why it cannot be used.
void check_and_add(ManifestEntry e, Manifest& m) {
  std::string why;
  if (e.path.empty()) why = "no video path";
  else if (trim(e.caption).empty() && e.text_embedding.empty()) why = "no caption and no text_embedding";
  else if (e.start >= 0 && e.end >= 0 && e.end <= e.start) why = "end (" + std::to_string(e.end) + " s) is not after start (" + std::to_string(e.start) + " s)";
  if (why.empty()) m.entries.push_back(std::move(e));
  else m.rejected.push_back({e.where, why});
}

// Splits one CSV record (RFC 4180 quoting; the record is on one line).
bool split_csv(const std::string& line, std::vector<std::string>& out) {
  out.clear();
  std::string cur;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') cur += '"', ++i;
      else if (c == '"') quoted = false;
      else cur += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(cur), cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  out.push_back(cur);
  return !quoted;
}

double parse_seconds(const std::string& s, bool& ok) {
  if (trim(s).empty()) return -1;
  try {
    size_t used = 0;
    double v = std::stod(s, &used);
    ok = ok && trim(s.substr(used)).empty() && v >= 0;
    return v;
  } catch (...) {
    ok = false;
    return -1;
  }
}

void read_jsonl(const std::string& path, Manifest& m) {
  std::ifstream in(path);
  const fs::path base = fs::path(path).parent_path();
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (trim(line).empty()) continue;
    ManifestEntry e;
    e.where = path + ":" + std::to_string(n);
    try {
      auto j = nlohmann::json::parse(line);
      if (!j.is_object()) throw std::runtime_error("not a JSON object");
      e.path = resolve(j.value("path", std::string()), base);
      e.caption = j.value("caption", std::string());
      e.start = j.contains("start") && !j["start"].is_null() ? j["start"].get<double>() : -1;
      e.end = j.contains("end") && !j["end"].is_null() ? j["end"].get<double>() : -1;
      e.text_embedding = resolve(j.value("text_embedding", std::string()), base);
      if ((e.start < 0 && e.start != -1) || (e.end < 0 && e.end != -1))
        throw std::runtime_error("start and end must be >= 0 seconds");
    } catch (const std::exception& ex) {
      m.rejected.push_back({e.where, std::string("bad manifest line: ") + ex.what()});
      continue;
    }
    check_and_add(std::move(e), m);
  }
}

void read_csv(const std::string& path, Manifest& m) {
  std::ifstream in(path);
  const fs::path base = fs::path(path).parent_path();
  std::string line;
  std::vector<std::string> f;
  VIDIT_CHECK(std::getline(in, line) && split_csv(line, f), "manifest '", path,
              "' has no CSV header row; the first line must name the columns, e.g. path,caption,start,end");
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < f.size(); ++i) col[trim(f[i])] = i;
  VIDIT_CHECK(col.count("path") && (col.count("caption") || col.count("text_embedding")), "manifest '", path,
              "': the CSV header must have a 'path' column and a 'caption' (or 'text_embedding') column; it has: ", line);
  auto field = [&](const char* name) { return col.count(name) && col[name] < f.size() ? f[col[name]] : std::string(); };
  for (int64_t n = 2; std::getline(in, line); ++n) {
    if (trim(line).empty()) continue;
    ManifestEntry e;
    e.where = path + ":" + std::to_string(n);
    if (!split_csv(line, f)) {
      m.rejected.push_back({e.where, "unterminated quote (records must be on one line)"});
      continue;
    }
    bool ok = true;
    e.path = resolve(trim(field("path")), base);
    e.caption = field("caption");
    e.start = parse_seconds(field("start"), ok);
    e.end = parse_seconds(field("end"), ok);
    e.text_embedding = resolve(trim(field("text_embedding")), base);
    if (!ok) {
      m.rejected.push_back({e.where, "start / end must be non-negative numbers of seconds"});
      continue;
    }
    check_and_add(std::move(e), m);
  }
}

void read_folder(const std::string& dir, Manifest& m) {
  static const std::vector<std::string> exts = {".mp4", ".mkv", ".webm", ".mov", ".avi", ".m4v"};
  std::vector<fs::path> videos;
  for (const auto& it : fs::recursive_directory_iterator(dir)) {
    if (!it.is_regular_file()) continue;
    std::string ext = it.path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    if (std::find(exts.begin(), exts.end(), ext) != exts.end()) videos.push_back(it.path());
  }
  std::sort(videos.begin(), videos.end());
  for (const auto& v : videos) {
    ManifestEntry e;
    e.path = v.string();
    fs::path side = v;
    side.replace_extension(".txt");
    e.where = side.string();
    std::ifstream in(side);
    if (!in) {
      m.rejected.push_back({v.string(), "no caption file " + side.string()});
      continue;
    }
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    e.caption = trim(text);
    check_and_add(std::move(e), m);
  }
}

}  // namespace

// A clip listed twice (the same video, by its normalised absolute path, and window) would be
// prepared twice, and trained on twice as often: the later lines are rejections naming the first.
void reject_repeats(Manifest& m) {
  std::map<std::string, std::string> first;  // clip -> where it was listed first
  std::vector<ManifestEntry> kept;
  for (ManifestEntry& e : m.entries) {
    char window[64];
    std::snprintf(window, sizeof window, "|%.17g|%.17g", e.start, e.end);
    const std::string clip = fs::absolute(e.path).lexically_normal().string() + window;
    auto [at, fresh] = first.emplace(clip, e.where);
    if (fresh) kept.push_back(std::move(e));
    else m.rejected.push_back({e.where, "repeats " + at->second + " (the same video and window): each clip is listed once"});
  }
  m.entries = std::move(kept);
}

bool worker_takes(const Manifest& m, size_t i, int worker, int workers) {
  const int64_t unit = m.entries[i].unit >= 0 ? m.entries[i].unit : int64_t(i);
  return unit % workers == worker;
}

bool is_shard_manifest(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  return ext == ".tar" || ext == ".txt" || path.find('{') != std::string::npos;
}

namespace {

// The shards a shard manifest names, in order.
std::vector<std::string> shard_paths(const std::string& path) {
  if (fs::path(path).extension() != ".txt") return expand_shard_pattern(path);
  std::ifstream in(path);
  VIDIT_CHECK(in, "cannot read the shard list '", path, "': ", std::strerror(errno));
  const fs::path base = fs::path(path).parent_path();
  std::vector<std::string> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    try {
      for (const std::string& s : expand_shard_pattern(resolve(line, base))) out.push_back(s);
    } catch (const Error& e) {
      fail("shard list '", path, "' line ", n, ": ", e.what());
    }
  }
  return out;
}

// Every sample of every shard, each shard its own unit of work.
void read_shards(const std::string& path, Manifest& m) {
  const std::vector<std::string> shards = shard_paths(path);
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string& shard = shards[k];
    std::error_code ec;
    if (!fs::is_regular_file(shard, ec)) {
      m.rejected.push_back({shard, "shard missing (listed by '" + path + "'): download it again or drop it"});
      continue;
    }
    std::vector<WebDatasetReject> rejects;
    for (WebDatasetSample& s : read_webdataset_shard(shard, &rejects)) {
      ManifestEntry e;
      e.path = shard + "/" + s.video.name;
      e.caption = std::move(s.caption);
      e.where = shard + ":" + s.video.name;
      e.shard = shard;
      e.member_offset = s.video.offset, e.member_size = s.video.size;
      e.unit = int64_t(k);
      check_and_add(std::move(e), m);
    }
    for (const WebDatasetReject& r : rejects)
      m.rejected.push_back({r.shard + (r.member.empty() ? "" : ":" + r.member), r.reason});
  }
}

}  // namespace

Manifest read_manifest(const std::string& path) {
  Manifest m;
  if (is_shard_manifest(path) && !fs::is_directory(path)) {
    VIDIT_CHECK(path.find('{') != std::string::npos || fs::exists(path), "manifest '", path, "' does not exist");
    read_shards(path, m);
    reject_repeats(m);
    return m;
  }
  VIDIT_CHECK(fs::exists(path), "manifest '", path, "' does not exist");
  if (fs::is_directory(path)) {
    read_folder(path, m);
    return m;
  }
  std::ifstream probe(path);
  VIDIT_CHECK(probe, "cannot read manifest '", path, "': ", std::strerror(errno));
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".csv") read_csv(path, m);
  else if (ext == ".jsonl" || ext == ".json") read_jsonl(path, m);
  else fail("manifest '", path, "': unknown format; use a .jsonl or .csv file, a folder of videos with .txt captions, "
            "or WebDataset shards (a .tar, a brace pattern such as shards/{00000..00099}.tar, or a .txt list of them)");
  reject_repeats(m);
  return m;
}

}  // namespace vidit

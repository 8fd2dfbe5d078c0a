// The list of training clips a user hands to `vidit prepare`.
//
// Four forms:
//   - JSON lines (*.jsonl): {"path": ..., "caption": ..., "start": s, "end": s, "text_embedding": f}
//     with start / end (seconds) and text_embedding (a safetensors file) optional;
//   - CSV (*.csv) with a header row naming the same columns (path and caption required), fields
//     quoted with "..." when they hold commas or quotes ("" inside quotes is one quote);
//   - a folder: every video file under it (mp4, mkv, webm, mov, avi, m4v), each with a sidecar
//     caption file of the same name and extension .txt;
//   - WebDataset tar shards (prepare/webdataset.h): one shard (*.tar), a brace pattern of them
//     (`shards/{00000..00999}.tar`), or a list of them (*.txt: one shard or pattern per line,
//     relative to the list's folder; # starts a comment). Each sample (a video member and its
//     caption) is an entry whose path is <shard>/<member>, as if the tar were a folder, read in
//     place (its bytes' offset and size in the shard); each shard is one unit of work for the
//     workers of `vidit prepare`. A missing, truncated or damaged shard, and each unusable key of
//     one, is a rejection naming the shard and member; the rest carry on.
// Relative paths are resolved against the manifest's folder. A line that cannot be used (bad
// JSON, no path, no caption, end <= start, missing sidecar, the same video and window as an
// earlier line) is returned as a rejection with its
// line and reason, never thrown, so one bad line does not stop a million-clip run.
#pragma once
#include <string>
#include <vector>

namespace vidit {

struct ManifestEntry {
  std::string path;
  std::string caption;
  double start = -1, end = -1;     // seconds; -1: from the start / to the end
  std::string text_embedding;      // precomputed text embedding file, or empty
  std::string where;               // "manifest.jsonl:12" or the sidecar file, for messages
  // A WebDataset member: its shard, and where the video's bytes lie in it (`path` is then
  // <shard>/<member>). "" and -1 for a file of its own.
  std::string shard;
  int64_t member_offset = -1, member_size = -1;
  // The unit of work a worker of `vidit prepare` takes whole (a shard's index); -1: this entry alone.
  int64_t unit = -1;
  bool in_shard() const { return member_size >= 0; }
};

struct ManifestRejection {
  std::string where, reason;
};

struct Manifest {
  std::vector<ManifestEntry> entries;
  std::vector<ManifestRejection> rejected;
};

// Throws vidit::Error only when `path` itself cannot be read, a CSV header lacks a column, or a
// shard pattern is malformed.
Manifest read_manifest(const std::string& path);

// True when `path` names WebDataset shards (a .tar, a brace pattern or a .txt list of them).
bool is_shard_manifest(const std::string& path);

// Whether worker `worker` of `workers` takes entry `i` of `m`: units of work (a shard, taken whole;
// else the entry alone) dealt round-robin over the workers. Every step of a worker's pass (its
// captions, its clips) takes the same entries.
bool worker_takes(const Manifest& m, size_t i, int worker, int workers);

}  // namespace vidit

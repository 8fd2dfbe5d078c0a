// The list of training clips a user hands to `vidit prepare`.
//
// Three forms:
//   - JSON lines (*.jsonl): {"path": ..., "caption": ..., "start": s, "end": s, "text_embedding": f}
//     with start / end (seconds) and text_embedding (a safetensors file) optional;
//   - CSV (*.csv) with a header row naming the same columns (path and caption required), fields
//     quoted with "..." when they hold commas or quotes ("" inside quotes is one quote);
//   - a folder: every video file under it (mp4, mkv, webm, mov, avi, m4v), each with a sidecar
//     caption file of the same name and extension .txt.
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
};

struct ManifestRejection {
  std::string where, reason;
};

struct Manifest {
  std::vector<ManifestEntry> entries;
  std::vector<ManifestRejection> rejected;
};

// Throws vidit::Error only when `path` itself cannot be read or a CSV header lacks a column.
Manifest read_manifest(const std::string& path);

}  // namespace vidit

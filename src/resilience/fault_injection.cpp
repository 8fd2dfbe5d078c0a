#include "resilience/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"

namespace vidit {
namespace fs = std::filesystem;

void FaultInjector::after_step(int64_t step) {
  if (fired_ || step != cfg_.step || rank_ != int(cfg_.rank)) return;
  if (cfg_.kind == FaultKind::exit) {
    fired_ = true;
    std::fprintf(stderr, "fault injection: rank %d exits after step %lld\n", rank_, (long long)step);
    std::fflush(nullptr);
    std::_Exit(17);
  }
  if (cfg_.kind == FaultKind::sigterm) {
    fired_ = true;
    std::fprintf(stderr, "fault injection: rank %d sends itself SIGTERM after step %lld\n", rank_, (long long)step);
    ::raise(SIGTERM);
    return;
  }
  if (cfg_.kind == FaultKind::kill) {
    fired_ = true;
    std::fprintf(stderr, "fault injection: rank %d kills itself (SIGKILL) after step %lld\n", rank_, (long long)step);
    ::kill(::getpid(), SIGKILL);
  }
}

void FaultInjector::after_save(int64_t step, const std::string& dir) {
  if (fired_ || dir.empty() || step != cfg_.step) return;
  if (cfg_.kind != FaultKind::corrupt_checkpoint && cfg_.kind != FaultKind::truncate_checkpoint) return;
  fired_ = true;
  // The first model part: model.safetensors, or model.part-00000-of-N.safetensors.
  std::vector<fs::path> parts;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("model", 0) == 0) parts.push_back(e.path());
  std::sort(parts.begin(), parts.end());
  VIDIT_CHECK(!parts.empty(), "fault injection: no model part in ", dir);
  const fs::path file = parts[0];
  const uintmax_t size = fs::file_size(file);
  if (cfg_.kind == FaultKind::truncate_checkpoint) {
    fs::resize_file(file, size / 2);
    std::fprintf(stderr, "fault injection: truncated %s to %llu of %llu bytes\n", file.c_str(),
                 (unsigned long long)(size / 2), (unsigned long long)size);
    return;
  }
  // 4 KiB of garbage in the middle, past the header: the tensors' bytes change, not the layout.
  const uintmax_t n = std::min<uintmax_t>(4096, size / 4), at = size / 2;
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  VIDIT_CHECK(f, "fault injection: cannot open ", file.string());
  std::vector<char> bytes(n);
  f.seekg(std::streamoff(at));
  f.read(bytes.data(), std::streamsize(n));
  for (char& b : bytes) b = char(~b);
  f.seekp(std::streamoff(at));
  f.write(bytes.data(), std::streamsize(n));
  f.close();
  std::fprintf(stderr, "fault injection: flipped %llu bytes at offset %llu of %s\n", (unsigned long long)n,
               (unsigned long long)at, file.c_str());
}

}  // namespace vidit

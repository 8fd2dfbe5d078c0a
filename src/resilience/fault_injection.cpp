#include "resilience/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <thread>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "resilience/faulty_storage.h"

namespace vidit {
namespace fs = std::filesystem;

int64_t launcher_attempt() {
  int64_t attempt = 0;
  for (const char* var : {"TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"})
    if (const char* v = std::getenv(var); v && *v) attempt = std::max<int64_t>(attempt, std::atoll(v));
  return attempt;
}

FaultInjector::FaultInjector(const FaultConfig& cfg, int rank) : cfg_(cfg), rank_(rank) {
  on_ = cfg_.kind != FaultKind::none && launcher_attempt() == cfg_.attempt;
}

void FaultInjector::after_step(int64_t step, const TensorMap& params) {
  if (!mine(step)) return;
  switch (cfg_.kind) {
    case FaultKind::exit:
      fired_ = true;
      std::fprintf(stderr, "fault injection: rank %d exits after step %lld\n", rank_, (long long)step);
      std::fflush(nullptr);
      std::_Exit(17);
    case FaultKind::sigterm:
      fired_ = true;
      std::fprintf(stderr, "fault injection: rank %d sends itself SIGTERM after step %lld\n", rank_, (long long)step);
      ::raise(SIGTERM);
      return;
    case FaultKind::kill:
      fired_ = true;
      std::fprintf(stderr, "fault injection: rank %d kills itself (SIGKILL) after step %lld\n", rank_, (long long)step);
      ::kill(::getpid(), SIGKILL);
      return;
    case FaultKind::hang:
      fired_ = true;
      std::fprintf(stderr, "fault injection: rank %d hangs after step %lld\n", rank_, (long long)step);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(3600));
    case FaultKind::bitflip: {
      fired_ = true;
      // Bit 22 (the top mantissa bit) of the first element of the first floating weight: the
      // value moves by up to half of itself, and nothing notices by itself.
      for (const auto& [name, p] : params) {
        if (p.scalar_type() != at::kFloat || p.numel() == 0) continue;
        at::NoGradGuard ng;
        at::Tensor flat = p.detach().view(-1);
        const float before = flat[0].item<float>();
        at::Tensor bits = flat.narrow(0, 0, 1).view(at::kInt);
        bits.bitwise_xor_(1 << 22);
        std::fprintf(stderr, "fault injection: rank %d flipped bit 22 of %s[0] after step %lld (%g -> %g)\n", rank_,
                     name.c_str(), (long long)step, before, flat[0].item<float>());
        return;
      }
      return;
    }
    default:
      return;
  }
}

void FaultInjector::slow_compute(int64_t step) {
  if (!on_ || cfg_.kind != FaultKind::slow || rank_ != int(cfg_.rank) || step < cfg_.step) return;
  if (step == cfg_.step)
    std::fprintf(stderr, "fault injection: rank %d computes slowly (%.2f s more per step) from step %lld\n", rank_,
                 cfg_.seconds, (long long)step);
  std::this_thread::sleep_for(std::chrono::duration<double>(cfg_.seconds));
}

bool FaultInjector::process_fault_after(int64_t step) const {
  const FaultKind k = cfg_.kind;
  return on_ && step == cfg_.step &&
         (k == FaultKind::exit || k == FaultKind::kill || k == FaultKind::sigterm || k == FaultKind::hang);
}

bool FaultInjector::fire_in_step(FaultKind kind, int64_t step, const char* what) {
  if (cfg_.kind != kind || !mine(step)) return false;
  fired_ = true;
  std::fprintf(stderr, "fault injection: rank %d %s of step %lld\n", rank_, what, (long long)step);
  return true;
}

bool FaultInjector::poison_sample(int64_t step) {
  return fire_in_step(FaultKind::poison_sample, step, "poisons its first sample (latents x 1000)");
}

bool FaultInjector::glitch(int64_t step) {
  return fire_in_step(FaultKind::glitch, step, "corrupts its first prediction (x 100, once)");
}

bool FaultInjector::nan_gradient(int64_t step) {
  return fire_in_step(FaultKind::nan_grad, step, "makes its gradients NaN in backward (an overflow)");
}

Storage& FaultInjector::storage_for_save(int64_t step, Storage& base) {
  const FaultKind k = cfg_.kind;
  if (k != FaultKind::disk_full && k != FaultKind::io_error && k != FaultKind::slow_storage &&
      k != FaultKind::kill_in_save && k != FaultKind::crash_in_commit)
    return base;
  if (!mine(step)) return base;
  fired_ = true;
  storage_ = std::make_unique<FaultyStorage>(base, k, cfg_.seconds);
  return *storage_;
}

Storage& FaultInjector::storage_for_load(int64_t step, Storage& base) {
  const FaultKind k = cfg_.kind;
  if (k != FaultKind::load_io_error && k != FaultKind::load_permission && k != FaultKind::load_no_memory) return base;
  // faults.step 0: whichever checkpoint the resume reads first.
  if (!on_ || fired_ || rank_ != int(cfg_.rank) || (cfg_.step != 0 && step != cfg_.step)) return base;
  fired_ = true;
  storage_ = std::make_unique<FaultyStorage>(base, k, cfg_.seconds);
  return *storage_;
}

void FaultInjector::after_save(int64_t step, const std::string& dir) {
  if (!on_ || fired_ || dir.empty() || step != cfg_.step) return;
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

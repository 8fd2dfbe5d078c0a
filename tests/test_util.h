// Helpers shared by the tests: small configs and scratch directories.
#pragma once
#include <atomic>
#include <filesystem>
#include <functional>
#include <string>
#include <unistd.h>

#include "core/config.h"
#include "core/error.h"

namespace vidit::test {

// A very small model on random latents, for fast tests.
inline Config tiny_config(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = {
      "model.dim=32",          "model.ffn_dim=64",        "model.heads=2",        "model.layers=2",
      "model.in_channels=4",   "model.out_channels=4",    "model.text_dim=8",     "model.text_len=4",
      "model.freq_dim=16",     "model.patch=[1,2,2]",     "data.source=\"synthetic\"", "data.latent_frames=2", "data.latent_height=4",
      "data.latent_width=4",   "train.batch_size=2",      "train.threads=1",      "train.log_every=1000"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return parse_config("", "<test>", sets);
}

// The message of the vidit::Error `f` throws, or "(no error)".
inline std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A fresh directory under the system temp dir, removed when the object dies.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ = (std::filesystem::temp_directory_path() /
             ("vidit_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
                .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace vidit::test

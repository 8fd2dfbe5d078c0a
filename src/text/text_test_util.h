// Shared by the text tests: the outputs of the Python references in tests/reference/ (e.g.
// umt5_reference.py: SentencePiece and transformers' UMT5EncoderModel), made once and kept in the
// build tree under a hash of the script, since CTest runs every test in its own process.
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

namespace vidit::text::test {

struct Reference {
  std::string dir;   // the outputs, when made
  std::string skip;  // why not (Python or a package missing: the script's exit status 3), else ""
  std::string error;  // the script failed otherwise: the tests fail with this
};

// Runs tests/reference/<script> --out DIR once per version of the script (the directory is
// <tag>_<hash of the script>); `needs` names the Python packages, for the skip message.
inline Reference python_reference(const std::string& script_name, const std::string& tag, const std::string& needs) {
  Reference r;
#ifndef VIDIT_PYTHON
  r.skip = "built without VIDIT_PYTHON: no Python to run tests/reference/" + script_name;
  return r;
#else
  namespace fs = std::filesystem;
  const std::string script = std::string(VIDIT_SOURCE_DIR) + "/tests/reference/" + script_name;
  std::ifstream in(script);
  std::stringstream text;
  text << in.rdbuf();
  const fs::path root = fs::path(VIDIT_BINARY).parent_path() / "test_data";
  const fs::path dir = root / (tag + "_" + std::to_string(std::hash<std::string>{}(text.str())));
  if (fs::exists(dir / "done")) {
    r.dir = dir.string();
    return r;
  }
  fs::create_directories(root);
  const fs::path tmp = root / (tag + "_tmp_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  const std::string cmd = std::string(VIDIT_PYTHON) + " " + script + " --out " + tmp.string() + " > " +
                          (tmp.string() + ".log") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream log(tmp.string() + ".log");
  std::stringstream log_text;
  log_text << log.rdbuf();
  fs::remove(tmp.string() + ".log");
  if (rc != 0) {
    fs::remove_all(tmp);
    const bool missing = WIFEXITED(rc) && WEXITSTATUS(rc) == 3;
    (missing ? r.skip : r.error) = "tests/reference/" + script_name + " failed (" + std::string(VIDIT_PYTHON) +
                                   "; needs " + needs + "): " + log_text.str().substr(0, 600);
    return r;
  }
  std::ofstream(tmp / "done") << "ok\n";
  std::error_code ec;
  fs::rename(tmp, dir, ec);  // another test process may have won the race: use its copy
  if (ec) fs::remove_all(tmp);
  r.dir = dir.string();
  return r;
#endif
}

inline const Reference& umt5_reference() {
  static const Reference ref =
      python_reference("umt5_reference.py", "umt5_ref", "torch, transformers, sentencepiece, safetensors");
  return ref;
}

// Skips the test (with the reason) when the reference cannot be made; else its directory.
#define VIDIT_UMT5_REFERENCE(dir_var)                                   \
  const auto& ref_ = ::vidit::text::test::umt5_reference();             \
  if (!ref_.skip.empty()) GTEST_SKIP() << ref_.skip;                    \
  ASSERT_TRUE(ref_.error.empty()) << ref_.error;                        \
  const std::string dir_var = ref_.dir

// max |a - b| / max |b|: the relative error the reference tests bound.
inline double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

}  // namespace vidit::text::test

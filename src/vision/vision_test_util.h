// Shared by the vision tests: the outputs of tests/reference/clip_vision_reference.py
// (transformers' CLIPVisionModel and CLIPImageProcessor, PIL, pictures made by the ffmpeg CLI),
// made once per version of the script by the same runner the text tests use, and kept in the
// build tree.
#pragma once
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "text/text_test_util.h"

namespace vidit::vision::test {

inline const text::test::Reference& clip_vision_reference() {
  static const text::test::Reference ref = text::test::python_reference(
      "clip_vision_reference.py", "clip_vision_ref", "torch, transformers, safetensors, Pillow, numpy");
  return ref;
}

// Skips the test (with the reason) when the reference cannot be made; else its directory.
#define VIDIT_CLIP_REFERENCE(dir_var)                                    \
  const auto& ref_ = ::vidit::vision::test::clip_vision_reference();     \
  if (!ref_.skip.empty()) GTEST_SKIP() << ref_.skip;                     \
  ASSERT_TRUE(ref_.error.empty()) << ref_.error;                         \
  const std::string dir_var = ref_.dir

// images/images.json of the reference: which pictures exist ("available" false, with "why",
// where the ffmpeg program was missing).
inline nlohmann::json reference_pictures(const std::string& dir) {
  std::ifstream in(dir + "/images/images.json");
  return nlohmann::json::parse(in);
}

using text::test::relative_error;

}  // namespace vidit::vision::test

// The local Storage's reading calls (what checkpoints use to find and check files instead of
// std::filesystem), on a real directory.
#include "core/storage.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>

#include "../../tests/test_util.h"
#include "core/error.h"

namespace vidit {
namespace {

TEST(Storage, ExistsListAndSizeOfARealDirectory) {
  test::ScratchDir dir("storage_list");
  Storage& s = local_storage();
  const std::string root = dir.path() + "/run";
  EXPECT_FALSE(s.exists(root));
  EXPECT_TRUE(s.list(root).empty()) << "a directory that is not there lists nothing";
  s.create_dirs(root + "/step_00000002");
  s.write_atomic(root + "/latest", "step_00000002\n");
  s.write_atomic(root + "/step_00000002/meta.json", std::string(1000, 'x'));
  EXPECT_TRUE(s.exists(root + "/step_00000002"));
  EXPECT_TRUE(s.exists(root + "/latest"));
  EXPECT_EQ(s.list(root), (std::vector<std::string>{"latest", "step_00000002"})) << "sorted names, not paths";
  EXPECT_EQ(s.size(root + "/step_00000002/meta.json"), 1000u);
  EXPECT_EQ(s.size(root + "/latest"), 14u);
  try {
    s.size(root + "/missing");
    FAIL() << "size of a missing file";
  } catch (const SystemError& e) {
    EXPECT_EQ(e.code(), ENOENT);
    EXPECT_NE(std::string(e.what()).find("/missing"), std::string::npos) << e.what();
  }
  s.remove_all(root + "/step_00000002");
  EXPECT_EQ(s.list(root), (std::vector<std::string>{"latest"}));
}

// A wrapper sees every reading call pass through it (what an object store or the fault
// injection's storage would implement).
TEST(Storage, ForwardingStoragePassesTheReadingCallsOn) {
  struct Counting : ForwardingStorage {
    using ForwardingStorage::ForwardingStorage;
    int calls = 0;
    bool exists(const std::string& p) override { return ++calls, ForwardingStorage::exists(p); }
    std::vector<std::string> list(const std::string& d) override { return ++calls, ForwardingStorage::list(d); }
    uint64_t size(const std::string& p) override { return ++calls, ForwardingStorage::size(p); }
  };
  test::ScratchDir dir("storage_forward");
  Counting c(local_storage());
  c.write_atomic(dir.path() + "/a", "abc");
  EXPECT_TRUE(c.exists(dir.path() + "/a"));
  EXPECT_EQ(c.list(dir.path()), std::vector<std::string>{"a"});
  EXPECT_EQ(c.size(dir.path() + "/a"), 3u);
  EXPECT_EQ(c.calls, 3);
}

}  // namespace
}  // namespace vidit

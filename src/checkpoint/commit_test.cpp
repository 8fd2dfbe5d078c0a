// The commit takes each part's record (sizes and checksums, as its writer verified them) from
// the ranks' control plane, not from the directory: it commits only with a record for every
// part, each recorded file there at its recorded size, and leaves no record files behind.
#include <gtest/gtest.h>

#include <filesystem>

#include "../../tests/test_util.h"
#include "checkpoint/checkpoint.h"
#include "core/storage.h"

namespace vidit {
namespace {

// Two parts of a state of two tensors, each cut in halves (a 2-rank FSDP layout).
struct TwoParts {
  CheckpointState meta;
  std::vector<CheckpointState> parts;
  TwoParts() {
    meta.step = 3;
    meta.config_toml = "[train]\n";
    meta.part.dims = {"shard"};
    meta.part.degrees = {2};
    const TensorMap whole = {{"a", at::arange(8, at::kFloat)}, {"b", at::arange(6, at::kFloat) * 2}};
    for (const auto& [name, t] : whole) meta.layouts[name] = Layout{t.sizes().vec(), {Cut{Cut::Kind::Flat, "shard", 0, 2}}};
    for (int i = 0; i < 2; ++i) {
      CheckpointState p = meta;
      p.part.index = i;
      for (const auto& [name, t] : whole) p.model[name] = t.chunk(2)[size_t(i)].clone();
      p.optimizer["step/" + std::to_string(i)] = at::tensor({double(i)});
      parts.push_back(p);
    }
  }
};

TEST(CheckpointCommit, NeedsEveryPartsRecordAtItsRecordedSize) {
  test::ScratchDir dir("commit_records");
  TwoParts s;
  Storage& storage = local_storage();
  const std::string tmp = begin_checkpoint(dir.path(), s.meta.step, storage);
  std::vector<PartRecord> records;
  for (const CheckpointState& p : s.parts) records.push_back(write_checkpoint_part(tmp, p, false, storage));
  ASSERT_EQ(records[1].index, 1);
  ASSERT_EQ(records[1].files.size(), 2u) << "model and optimizer";
  EXPECT_GT(records[1].bytes(), 0u);
  // A record travels as text and comes back the same.
  const PartRecord back = PartRecord::from_json(records[1].to_json());
  EXPECT_EQ(back.index, 1);
  EXPECT_EQ(back.bytes(), records[1].bytes());
  EXPECT_EQ(back.files.begin()->second.tensors, records[1].files.begin()->second.tensors);
  EXPECT_THROW(PartRecord::from_json("{\"index\": 1}"), Error);

  // Part 1's files are in the directory, but without its record nothing is committed.
  try {
    commit_checkpoint(dir.path(), s.meta, {records[0]}, 2, 0, storage);
    FAIL() << "committed without part 1's record";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("part 1 of 2 has no writer's record"), std::string::npos) << e.what();
  }
  // A record whose size the file does not have (a file cut short after it was verified).
  std::vector<PartRecord> wrong = records;
  wrong[1].files.begin()->second.bytes += 1;
  try {
    commit_checkpoint(dir.path(), s.meta, wrong, 2, 0, storage);
    FAIL() << "committed a file not of its recorded size";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not the size its writer recorded"), std::string::npos) << e.what();
  }
  // The same part twice.
  EXPECT_THROW(commit_checkpoint(dir.path(), s.meta, {records[0], records[0], records[1]}, 2, 0, storage), Error);
  EXPECT_TRUE(latest_checkpoint(dir.path()) == std::nullopt) << "nothing was committed";

  // Every record: committed, readable whole, and only the checkpoint's own files are there.
  const std::string committed = commit_checkpoint(dir.path(), s.meta, records, 2, 0, storage);
  ASSERT_EQ(latest_checkpoint(dir.path()), committed);
  CheckpointReader reader(committed);
  EXPECT_TRUE(reader.whole("model", "a").equal(at::arange(8, at::kFloat)));
  EXPECT_TRUE(reader.whole("model", "b").equal(at::arange(6, at::kFloat) * 2));
  std::vector<std::string> names = storage.list(committed);
  EXPECT_EQ(names, (std::vector<std::string>{"manifest.json", "meta.json", "model.part-00000-of-00002.safetensors",
                                             "model.part-00001-of-00002.safetensors",
                                             "optimizer.part-00000-of-00002.safetensors",
                                             "optimizer.part-00001-of-00002.safetensors"}));
}

// The writer reads each file back through the same Storage it wrote it with (so an object store
// checks its own copy): a store that gives back other bytes than it took, or fewer, fails the
// part, naming the file and the tensor, and no record is made.
class LossyStorage : public ForwardingStorage {
 public:
  enum class Loss { flip, short_read };
  LossyStorage(Storage& base, Loss loss) : ForwardingStorage(base), loss_(loss) {}
  std::unique_ptr<ReadableFile> open(const std::string& path) override {
    struct Lossy : ReadableFile {
      std::unique_ptr<ReadableFile> inner;
      Loss loss;
      size_t read_at(uint64_t offset, void* out, size_t bytes) override {
        if (loss == Loss::short_read) return 0;  // the file ends before its tensors
        const size_t n = inner->read_at(offset, out, bytes);
        if (n > 0) static_cast<char*>(out)[n - 1] ^= 0x10;  // one bit of the last byte
        return n;
      }
      const std::string& path() const override { return inner->path(); }
    };
    auto f = std::make_unique<Lossy>();
    f->inner = base().open(path);
    f->loss = loss_;
    return f;
  }

 private:
  Loss loss_;
};

TEST(CheckpointCommit, AWriteTheStorageDoesNotGiveBackFailsThePart) {
  test::ScratchDir dir("commit_readback");
  TwoParts s;
  for (auto [loss, says] : {std::pair{LossyStorage::Loss::flip, std::string("reads back different from what was written")},
                            std::pair{LossyStorage::Loss::short_read, std::string("reads back short")}}) {
    LossyStorage lossy(local_storage(), loss);
    const std::string tmp = begin_checkpoint(dir.path(), s.meta.step, lossy);
    try {
      write_checkpoint_part(tmp, s.parts[0], false, lossy);
      FAIL() << "a part the storage does not give back was recorded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(".part-00000-of-00002.safetensors'"), std::string::npos) << e.what();
    }
  }
  // The same part through the storage itself verifies.
  const std::string tmp = begin_checkpoint(dir.path(), s.meta.step, local_storage());
  EXPECT_EQ(write_checkpoint_part(tmp, s.parts[0], false, local_storage()).files.size(), 2u);
}

}  // namespace
}  // namespace vidit

#include "checkpoint/checkpoint.h"


#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <cmath>
#include <future>
#include <set>

#include <c10/util/Exception.h>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/storage.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace vidit {
namespace fs = std::filesystem;

namespace {

std::string step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}

// The file of part `index` of `count` (one part: the plain name).
std::string part_name(const std::string& what, int64_t index, int64_t count) {
  if (count <= 1) return what + ".safetensors";
  char name[128];
  std::snprintf(name, sizeof name, "%s.part-%05lld-of-%05lld.safetensors", what.c_str(), (long long)index,
                (long long)count);
  return name;
}

// The first format's names: FSDP shard k of S, of tensor-parallel part t of T (T > 1).
std::string v1_part_name(const std::string& what, int64_t k, int64_t S, int64_t t, int64_t T) {
  char name[128];
  if (T > 1)
    std::snprintf(name, sizeof name, "%s.tp-%05lld-of-%05lld.shard-%05lld-of-%05lld.safetensors", what.c_str(),
                  (long long)t, (long long)T, (long long)k, (long long)S);
  else
    std::snprintf(name, sizeof name, "%s.shard-%05lld-of-%05lld.safetensors", what.c_str(), (long long)k, (long long)S);
  return name;
}

nlohmann::json layout_json(const Layout& l) {
  nlohmann::json cuts = nlohmann::json::array();
  for (const Cut& c : l.cuts) {
    nlohmann::json j = {{"over", c.over}, {"degree", c.degree}};
    if (c.kind == Cut::Kind::Split)
      j["split_dim"] = c.dim;
    else
      j["flat"] = true;
    cuts.push_back(j);
  }
  return {{"shape", l.shape}, {"cuts", cuts}};
}

Layout layout_from_json(const nlohmann::json& j) {
  Layout l;
  l.shape = j.at("shape").get<std::vector<int64_t>>();
  for (const auto& c : j.at("cuts")) {
    Cut cut;
    cut.over = c.at("over").get<std::string>();
    cut.degree = c.at("degree").get<int>();
    if (c.contains("split_dim")) {
      cut.kind = Cut::Kind::Split;
      cut.dim = c.at("split_dim").get<int>();
    } else {
      cut.kind = Cut::Kind::Flat;
    }
    l.cuts.push_back(cut);
  }
  return l;
}

std::string hex64(uint64_t h) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  return hex;
}

// The checksum of a tensor's bytes (contiguous), as 16 hex digits.
std::string checksum(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return hex64(XXH3_64bits(c.data_ptr(), size_t(c.numel()) * c.element_size()));
}

// Writes `tensors` to `path` and fsyncs it; returns where the tensors' bytes begin.
uint64_t write_file(Storage& storage, const std::string& path, const TensorMap& tensors) {
  std::unique_ptr<WritableFile> f = storage.create(path);
  const uint64_t data_start = write_safetensors(*f, tensors);
  f->sync();
  f->close();
  return data_start;
}

// Reads the file written by write_file back through `storage` and checks every byte against
// what was meant to be written; returns the file's entry of the manifest (its size, each
// tensor's checksum, of the bytes read back). The read-back streams the file through one buffer
// (ranged reads, not a mapping: page faults over gigabytes cost more than the copy), compares
// each chunk with the tensor's memory and hashes it while it is in cache: one pass over the
// state besides the write. A tensor that is not finite fails the file (so the part, so the
// save): a non-finite state is never committed. (A sum in double is finite exactly when every
// value is: fp32's largest times any tensor's size stays far below double's range.)
nlohmann::json verify_file(Storage& storage, const std::string& path, const TensorMap& tensors, uint64_t data_start,
                           int64_t step) {
  std::vector<std::pair<std::string, at::Tensor>> order;  // the file's order (the map's), CPU, contiguous
  for (const auto& [key, t] : tensors) order.emplace_back(key, t.detach().to(at::kCPU).contiguous());
  std::unique_ptr<ReadableFile> file;
  try {
    file = storage.open(path);
  } catch (const std::exception& e) {
    fail("checkpoint part '", path, "' cannot be read back: ", e.what());
  }
  std::vector<char> buf(8 << 20);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  nlohmann::json sums = nlohmann::json::object();
  uint64_t at = data_start;
  for (const auto& [key, t] : order) {
    VIDIT_CHECK(!t.is_floating_point() || std::isfinite(t.sum(at::kDouble).item<double>()), "refusing to save step ",
                step, ": the training state is not finite ('", key, "' in ", path,
                "); the last good checkpoint is kept. Lower train.lr or raise train.warmup_steps");
    XXH3_64bits_reset(state.get());
    const char* want = static_cast<const char*>(t.data_ptr());
    const uint64_t bytes = uint64_t(t.numel()) * t.element_size();
    for (uint64_t done = 0; done < bytes;) {
      const size_t n = file->read_at(at, buf.data(), size_t(std::min<uint64_t>(bytes - done, buf.size())));
      VIDIT_CHECK(n > 0, "checkpoint part '", path, "' reads back short at byte ", at, " (end of file): the storage lost data");
      VIDIT_CHECK(std::memcmp(buf.data(), want + done, n) == 0, "checkpoint part '", path, "': '", key,
                  "' reads back different from what was written (storage fault)");
      XXH3_64bits_update(state.get(), buf.data(), n);
      at += n, done += n;
    }
    sums[key] = hex64(XXH3_64bits_digest(state.get()));
  }
  const uint64_t size = storage.size(path);
  VIDIT_CHECK(size == at, "checkpoint part '", path, "' has ", size, " bytes, not the ", at, " written");
  return {{"bytes", size}, {"tensors", sums}};
}

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

// `name` in `root` is a committed checkpoint: step_N, with its meta.json (written last).
bool is_committed(Storage& storage, const std::string& root, const std::string& name) {
  return name.rfind("step_", 0) == 0 && name.find('.') == std::string::npos &&
         storage.exists(join(join(root, name), "meta.json"));
}

int64_t step_of(const fs::path& dir) { return std::stoll(dir.filename().string().substr(5)); }

// The committed checkpoints in `root` (names), oldest first.
std::vector<std::string> committed(Storage& storage, const std::string& root) {
  std::vector<std::string> out;
  for (const std::string& n : storage.list(root))
    if (is_committed(storage, root, n)) out.push_back(n);
  std::sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) { return step_of(a) < step_of(b); });
  return out;
}

}  // namespace

std::string checkpoint_tmp_dir(const std::string& out_dir, int64_t step) {
  return (fs::path(out_dir) / "checkpoints" / (step_name(step) + ".tmp")).string();
}

std::string begin_checkpoint(const std::string& out_dir, int64_t step, Storage& storage,
                             const std::vector<int64_t>& writing) {
  const fs::path root = fs::path(out_dir) / "checkpoints";
  storage.create_dirs(root.string());
  // Saves that never committed (a killed run) leave .tmp directories: every one found now is
  // stale, but those of the saves still being written.
  std::set<std::string> keep;
  for (int64_t s : writing) keep.insert(step_name(s) + ".tmp");
  for (const std::string& n : storage.list(root.string()))
    if (n.rfind("step_", 0) == 0 && n.size() > 4 && n.substr(n.size() - 4) == ".tmp" && !keep.count(n))
      storage.remove_all(join(root.string(), n));
  fs::path tmp = checkpoint_tmp_dir(out_dir, step);
  storage.create_dirs(tmp.string());
  return tmp.string();
}

uint64_t PartRecord::bytes() const {
  uint64_t n = 0;
  for (const auto& [file, f] : files) n += f.bytes;
  return n;
}

std::string PartRecord::to_json() const {
  nlohmann::json files_json = nlohmann::json::object();
  for (const auto& [file, f] : files) files_json[file] = {{"bytes", f.bytes}, {"tensors", f.tensors}};
  return nlohmann::json{{"index", index}, {"files", files_json}}.dump();
}

PartRecord PartRecord::from_json(const std::string& text) {
  PartRecord r;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    r.index = j.at("index").get<int64_t>();
    for (const auto& [file, f] : j.at("files").items())
      r.files[file] = {f.at("bytes").get<uint64_t>(), f.at("tensors").get<std::map<std::string, std::string>>()};
  } catch (const nlohmann::json::exception& e) {
    fail("a checkpoint part's record is malformed: ", e.what());
  }
  return r;
}

PartRecord write_checkpoint_part(const std::string& tmp_dir, const CheckpointState& s, bool has_ema, Storage& storage) {
  fs::path tmp(tmp_dir);
  PartRecord record;
  record.index = s.part.index;
  // The files one after another, the largest first; each one is read back and verified on a
  // second thread while the next is written, so the disk never waits for a verification and
  // only the last (smallest) file's read-back is not hidden.
  std::vector<std::pair<std::string, const TensorMap*>> todo = {{"optimizer", &s.optimizer}, {"model", &s.model}};
  if (has_ema) todo.insert(todo.begin() + 1, {"ema", &s.ema});
  std::future<nlohmann::json> verifying;
  std::string verifying_file;
  auto collect = [&] {
    if (!verifying.valid()) return;
    const nlohmann::json entry = verifying.get();  // rethrows what the verification threw
    record.files[verifying_file] = {entry.at("bytes").get<uint64_t>(),
                                    entry.at("tensors").get<std::map<std::string, std::string>>()};
  };
  for (const auto& [what, m] : todo) {
    const std::string file = part_name(what.c_str(), s.part.index, s.part.count()), path = (tmp / file).string();
    const uint64_t data_start = write_file(storage, path, *m);
    collect();
    verifying_file = file;
    verifying = std::async(std::launch::async, [&storage, path, m, data_start, step = s.step] {
      return verify_file(storage, path, *m, data_start, step);
    });
  }
  collect();
  return record;
}

std::string commit_checkpoint(const std::string& out_dir, const CheckpointState& s, const std::vector<PartRecord>& parts,
                              int64_t keep, int64_t keep_every, Storage& storage) {
  fs::path root = fs::path(out_dir) / "checkpoints";
  const std::string name = step_name(s.step);
  fs::path final_dir = root / name, tmp = root / (name + ".tmp");
  nlohmann::json meta = {{"format", "vidit-checkpoint-2"},
                         {"step", s.step},
                         {"ema_updates", s.ema_updates},
                         {"sampler", {{"seed", s.sampler.seed}, {"epoch", s.sampler.epoch},
                                      {"position", s.sampler.position}}},
                         {"config", s.config_toml}};
  nlohmann::json layouts = nlohmann::json::object();
  for (const auto& [name, l] : s.layouts) layouts[name] = layout_json(l);
  meta["layouts"] = layouts;
  meta["parts"] = {{"dims", s.part.dims}, {"degrees", s.part.degrees}};
  // The manifest: every part's files, sizes and tensor checksums, each part verified by its
  // writer and its record handed to the commit (through the ranks' collectives, not the
  // directory). Committed only when every part is there with the size its writer recorded.
  nlohmann::json manifest = {{"parts", s.part.count()}, {"files", nlohmann::json::object()}};
  // Every part exactly once, each of its files in the directory at the size its writer recorded.
  std::vector<const PartRecord*> by_index(size_t(s.part.count()), nullptr);
  for (const PartRecord& p : parts) {
    if (p.index < 0) continue;  // a rank that writes no part
    VIDIT_CHECK(p.index < s.part.count(), "checkpoint '", tmp.string(), "': a writer recorded part ", p.index, " of ",
                s.part.count());
    VIDIT_CHECK(!by_index[size_t(p.index)], "checkpoint '", tmp.string(), "': part ", p.index, " was recorded twice");
    by_index[size_t(p.index)] = &p;
  }
  for (int64_t i = 0; i < s.part.count(); ++i) {
    VIDIT_CHECK(by_index[size_t(i)], "checkpoint '", tmp.string(), "': part ", i, " of ", s.part.count(),
                " has no writer's record: not committing it");
    for (const auto& [file, f] : by_index[size_t(i)]->files) {
      const std::string path = (tmp / file).string();
      VIDIT_CHECK(storage.exists(path) && storage.size(path) == f.bytes, "checkpoint '", tmp.string(), "': ", file,
                  " is missing or not the size its writer recorded");
      manifest["files"][file] = {{"bytes", f.bytes}, {"tensors", f.tensors}};
    }
  }
  storage.write_atomic((tmp / "manifest.json").string(), manifest.dump(1));
  storage.write_atomic((tmp / "meta.json").string(), meta.dump(2));
  // Re-saving a step that exists: the old one stays until the new one is in place.
  const fs::path old = root / (name + ".old");
  storage.remove_all(old.string());
  if (storage.exists(final_dir.string())) storage.rename(final_dir.string(), old.string());
  storage.rename(tmp.string(), final_dir.string());
  storage.sync_dir(root.string());
  storage.write_atomic((root / "latest").string(), name + "\n");
  storage.remove_all(old.string());

  // Retention: the newest `keep` committed checkpoints, and every `keep_every`-th step; the one
  // just written is always among them.
  const std::vector<std::string> all = committed(storage, root.string());
  for (size_t i = 0; i + keep < all.size(); ++i)
    if (all[i] != name && !(keep_every > 0 && step_of(all[i]) % keep_every == 0)) storage.remove_all(join(root.string(), all[i]));
  return final_dir.string();
}

std::string save_checkpoint(const std::string& out_dir, const CheckpointState& s, int64_t keep) {
  VIDIT_CHECK(s.part.count() == 1, "save_checkpoint writes states of one part");
  const PartRecord part = write_checkpoint_part(begin_checkpoint(out_dir, s.step, local_storage()), s, !s.ema.empty(),
                                                local_storage());
  return commit_checkpoint(out_dir, s, {part}, keep, 0, local_storage());
}

std::vector<std::string> checkpoint_candidates(const std::string& out_dir, Storage& storage) {
  const std::string root = join(out_dir, "checkpoints");
  std::vector<std::string> out;
  const std::vector<std::string> names = storage.list(root);
  // A crash between the commit's two renames (step N saved again: step_N -> step_N.old, then
  // step_N.tmp -> step_N) leaves step_N.old alone: it is the committed step N.
  for (const std::string& n : names) {
    if (n.rfind("step_", 0) != 0 || n.size() < 5 || n.substr(n.size() - 4) != ".old") continue;
    const std::string old = join(root, n), back = join(root, n.substr(0, n.size() - 4));
    if (!storage.exists(join(old, "meta.json")) || storage.exists(join(back, "meta.json"))) continue;
    try {
      storage.remove_all(back);  // an uncommitted leftover of that name, if any
      storage.rename(old, back);
      std::fprintf(stderr, "%s: put back from %s (a save of that step again was cut off between its renames)\n",
                   back.c_str(), n.c_str());
    } catch (const Error&) {
      // (left as it is: the candidates below are still the committed ones)
    }
  }
  // Every committed checkpoint (meta.json is written last, after the manifest), newest first.
  // `latest` names the newest too, but is not needed: a missing or stale pointer (a crash
  // between the rename and its update) changes nothing.
  const std::vector<std::string> all = committed(storage, root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) out.push_back(join(root, *it));
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& out_dir, Storage& storage) {
  const std::vector<std::string> all = checkpoint_candidates(out_dir, storage);
  if (all.empty()) return std::nullopt;
  return all[0];
}

std::vector<std::string> traces_of_checkpoints(const std::string& out_dir, Storage& storage) {
  const std::string root = join(out_dir, "checkpoints");
  std::vector<std::string> out;
  for (const std::string& n : storage.list(root))  // (sorted)
    if (n.rfind("step_", 0) == 0 && (n.find(".corrupt") != std::string::npos || n.find(".old") != std::string::npos))
      out.push_back(join(root, n));
  return out;
}

std::string set_aside_checkpoint(const std::string& dir, const std::string& now_latest, int64_t keep, Storage& storage) {
  std::string bad = dir + ".corrupt";
  for (int i = 2; storage.exists(bad); ++i) bad = dir + ".corrupt." + std::to_string(i);
  storage.rename(dir, bad);
  const std::string root = fs::path(dir).parent_path().string();
  if (!now_latest.empty()) storage.write_atomic(join(root, "latest"), fs::path(now_latest).filename().string() + "\n");
  if (keep > 0) {
    // The newest `keep` set aside stay for inspection: by step, then by the order they were set
    // aside in (step_N.corrupt, step_N.corrupt.2, ...).
    auto order = [](const std::string& n) {
      const size_t at = n.find(".corrupt");
      const std::string more = n.substr(at + 8);
      return std::make_pair(step_of(n), more.empty() ? int64_t(1) : int64_t(std::atoll(more.c_str() + 1)));
    };
    std::vector<std::string> aside;
    for (const std::string& n : storage.list(root))
      if (n.rfind("step_", 0) == 0 && n.find(".corrupt") != std::string::npos) aside.push_back(n);
    std::sort(aside.begin(), aside.end(), [&](const std::string& a, const std::string& b) { return order(a) > order(b); });
    for (size_t i = size_t(keep); i < aside.size(); ++i) {
      std::fprintf(stderr, "removing %s: only the newest %lld checkpoints set aside are kept\n",
                   join(root, aside[i]).c_str(), (long long)keep);
      try {
        storage.remove_all(join(root, aside[i]));
      } catch (const Error&) {
        // (it stays; the next set-aside tries again)
      }
    }
  }
  return bad;
}

int64_t seal_checkpoint(const std::string& dir, Storage& storage) {
  VIDIT_CHECK(storage.exists(join(dir, "meta.json")), "'", dir, "' has no meta.json: not a committed checkpoint");
  VIDIT_CHECK(!storage.exists(join(dir, "manifest.json")), "checkpoint '", dir,
              "' has a manifest already; `vidit checkpoint verify` checks it");
  nlohmann::json manifest = {{"files", nlohmann::json::object()}, {"sealed", true}};
  int64_t tensors = 0;
  for (const std::string& name : storage.list(dir)) {
    if (name.size() < 12 || name.substr(name.size() - 12) != ".safetensors") continue;
    const std::string path = join(dir, name);
    const std::unique_ptr<MappedFile> f = storage.map(path, "checkpoint file");
    nlohmann::json sums = nlohmann::json::object();
    for (const auto& [key, t] : view_safetensors(f->data(), f->size(), path)) sums[key] = checksum(t), ++tensors;
    manifest["files"][name] = {{"bytes", f->size()}, {"tensors", sums}};
  }
  storage.write_atomic(join(dir, "manifest.json"), manifest.dump(1));
  return tensors;
}

struct CheckpointReader::Part {
  std::string name;  // file name in the directory
  std::unique_ptr<MappedFile> file;
  TensorMap tensors;  // views into the mapping
};

namespace {
// Runs `f`, which reads `file`: a failure becomes CheckpointCorrupt naming the file, unless it is
// no proof of damage: an error of the system other than a file not found (EIO, EACCES, ENOMEM,
// ...), or memory running out. Those become CheckpointUnreadable.
template <class F>
auto classify(const std::string& file, F&& f) {
  try {
    return f();
  } catch (const CheckpointCorrupt&) {
    throw;
  } catch (const CheckpointUnreadable&) {
    throw;
  } catch (const SystemError& e) {
    if (e.code() == ENOENT) throw CheckpointCorrupt(e.what(), file);
    throw CheckpointUnreadable(e.what(), e.code());
  } catch (const std::bad_alloc&) {
    throw CheckpointUnreadable("out of memory while reading '" + file + "'", ENOMEM);
  } catch (const c10::OutOfMemoryError& e) {
    throw CheckpointUnreadable("out of memory while reading '" + file + "': " + e.what_without_backtrace(), ENOMEM);
  } catch (const std::exception& e) {
    throw CheckpointCorrupt(e.what(), file);
  }
}

// The format number of meta.json's "format" ("vidit-checkpoint-N"; none: the first); 0 when it
// is not one of ours.
int format_version(const nlohmann::json& meta) {
  if (!meta.contains("format")) return 1;
  const std::string f = meta.at("format").get<std::string>();
  const std::string prefix = "vidit-checkpoint-";
  if (f.rfind(prefix, 0) != 0 || f.size() == prefix.size()) return 0;
  for (size_t i = prefix.size(); i < f.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(f[i]))) return 0;
  return std::atoi(f.c_str() + prefix.size());
}
}  // namespace

CheckpointReader::CheckpointReader(const std::string& dir, Storage& storage) : dir_(dir) { open(storage); }

void CheckpointReader::open(Storage& storage) {
  const std::string& dir = dir_;
  fs::path d(dir);
  CheckpointState& s = meta_;
  // Each kind's files by part index.
  std::function<std::string(const std::string&, int64_t)> file_of;
  int64_t count = 1;
  int version = 0;
  classify("meta.json", [&] {
    const std::string text = storage.read((d / "meta.json").string());
    try {
      const nlohmann::json meta = nlohmann::json::parse(text);
      version = format_version(meta);
      VIDIT_CHECK(version > 0, "checkpoint '", dir, "': meta.json's format '", meta.at("format").dump(),
                  "' is not a vidit checkpoint's");
      if (version > kCheckpointFormat)
        throw CheckpointUnreadable("checkpoint '" + dir + "' is in format " + std::to_string(version) +
                                       ", written by a newer vidit; this one reads formats up to " +
                                       std::to_string(kCheckpointFormat) +
                                       ". Resume with the vidit that wrote it (or a newer one); the checkpoint is left as it is",
                                   0);
      s.step = meta.at("step").get<int64_t>();
      const std::string name = d.filename().string();
      if (name.rfind("step_", 0) == 0 && name.size() == 13 && name.find_first_not_of("0123456789", 5) == std::string::npos)
        VIDIT_CHECK(s.step == std::stoll(name.substr(5)), "checkpoint '", dir, "': meta.json says step ", s.step,
                    " but the directory is ", name);
      s.ema_updates = meta.at("ema_updates").get<int64_t>();
      s.sampler.seed = meta.at("sampler").at("seed").get<uint64_t>();
      s.sampler.epoch = meta.at("sampler").at("epoch").get<int64_t>();
      s.sampler.position = meta.at("sampler").at("position").get<int64_t>();
      s.config_toml = meta.at("config").get<std::string>();
      if (meta.contains("layouts")) {
        for (const auto& [name, l] : meta.at("layouts").items()) s.layouts[name] = layout_from_json(l);
        s.part.dims = meta.at("parts").at("dims").get<std::vector<std::string>>();
        s.part.degrees = meta.at("parts").at("degrees").get<std::vector<int>>();
        count = s.part.count();
        VIDIT_CHECK(count >= 1, "checkpoint '", dir, "': meta.json records ", count, " parts");
        file_of = [count](const std::string& what, int64_t i) { return part_name(what, i, count); };
      } else if (meta.contains("shards")) {
        // The first format: FSDP shards (and tensor-parallel parts) recorded as shapes of the
        // parts and split dims; as layouts, Split over "tensor" then Flat over "shard".
        const int S = meta.at("shards").at("count").get<int>();
        const int T = meta.contains("tensor") ? meta.at("tensor").at("count").get<int>() : 1;
        const auto shapes = meta.at("shards").at("shapes").get<std::map<std::string, std::vector<int64_t>>>();
        const auto split = meta.contains("tensor") ? meta.at("tensor").at("split").get<std::map<std::string, int>>()
                                                   : std::map<std::string, int>{};
        for (const auto& [name, shape] : shapes) {
          Layout l{shape, {}};
          auto it = split.find(name);
          if (T > 1 && it != split.end()) {
            l.shape[size_t(it->second)] *= T;
            l.cuts.push_back(Cut{Cut::Kind::Split, "tensor", it->second, T});
          }
          l.cuts.push_back(Cut{Cut::Kind::Flat, "shard", 0, S});
          s.layouts[name] = l;
        }
        s.part.dims = {"tensor", "shard"};
        s.part.degrees = {T, S};
        count = s.part.count();
        file_of = [S, T](const std::string& what, int64_t i) { return v1_part_name(what, i % S, S, i / S, T); };
      } else {
        file_of = [](const std::string& what, int64_t) { return what + ".safetensors"; };
      }
    } catch (const nlohmann::json::exception& e) {
      fail("checkpoint '", (d / "meta.json").string(), "' is malformed: ", e.what());
    }
  });
  // Every tensor read is verified against the manifest; a checkpoint without one is not loaded
  // unchecked. This format always commits one (before meta.json): without it, it was lost.
  if (!storage.exists((d / "manifest.json").string())) {
    if (version >= 2)
      throw CheckpointCorrupt("checkpoint '" + dir + "' has no manifest.json (every checkpoint of format " +
                                  std::to_string(version) + " is committed with one: it was removed or lost), so "
                                  "nothing in it can be verified",
                              "manifest.json");
    throw CheckpointUnreadable("checkpoint '" + dir + "' (format 1) has no manifest.json, so its tensors cannot be "
                               "verified. If you trust its files, `vidit checkpoint seal " + dir +
                               "` records their checksums and the run then loads it",
                               0);
  }
  classify("manifest.json", [&] {
    const std::string text = storage.read((d / "manifest.json").string());
    try {
      const nlohmann::json manifest = nlohmann::json::parse(text);
      for (const auto& [file, entry] : manifest.at("files").items()) {
        const uintmax_t bytes = entry.at("bytes").get<uintmax_t>();
        for (const auto& [key, sum] : entry.at("tensors").items()) sums_[file][key] = sum.get<std::string>();
        sizes_[file] = bytes;
      }
    } catch (const nlohmann::json::exception& e) {
      fail("checkpoint '", (d / "manifest.json").string(), "' is malformed: ", e.what());
    }
  });
  for (const auto& [file, bytes] : sizes_) {
    uint64_t size = 0;
    bool missing = false;
    try {
      size = storage.size((d / file).string());
    } catch (const SystemError& e) {
      if (e.code() != ENOENT)
        throw CheckpointUnreadable("checkpoint '" + dir + "': " + file + " cannot be read: " + e.what(), e.code());
      missing = true;
    }
    if (missing || size != bytes)
      throw CheckpointCorrupt("checkpoint '" + dir + "': " + file +
                                  (missing ? std::string(" is missing") : " has " + std::to_string(size) + " bytes, the manifest says " +
                                                                            std::to_string(bytes) + " (truncated or overwritten)"),
                              file);
  }
  for (const char* what : {"model", "ema", "optimizer"}) {
    if (std::string(what) == "ema" && !storage.exists((d / file_of(what, 0)).string()) && !sizes_.count(file_of(what, 0))) continue;  // saved without EMA
    std::vector<Part>& parts = parts_[what];
    for (int64_t i = 0; i < count; ++i) {
      const fs::path f = d / file_of(what, i);
      const std::string name = f.filename().string();
      if (!sizes_.count(name))
        throw CheckpointCorrupt("checkpoint '" + dir + "' lacks " + name +
                                    (count > 1 ? " (" + std::to_string(count) + " parts expected)" : std::string()) +
                                    (storage.exists(f.string()) ? ", or its manifest does not list it" : "") +
                                    ": it was not saved completely or was damaged since",
                                name);
      Part p;
      p.name = name;
      classify(name, [&] {
        p.file = storage.map(f.string(), "checkpoint file");
        p.tensors = view_safetensors(p.file->data(), p.file->size(), f.string());
      });
      parts.push_back(std::move(p));
    }
  }
}

CheckpointReader::~CheckpointReader() = default;

bool CheckpointReader::has(const std::string& what) const { return parts_.count(what) > 0; }

const std::vector<CheckpointReader::Part>& CheckpointReader::parts(const std::string& what) const {
  auto it = parts_.find(what);
  VIDIT_CHECK(it != parts_.end(), "checkpoint '", dir_, "' has no ", what, " state");
  return it->second;
}

std::vector<std::string> CheckpointReader::keys(const std::string& what) const {
  std::vector<std::string> out;
  for (const auto& [key, t] : parts(what)[0].tensors) out.push_back(key);  // part 0 holds every key
  return out;
}

// A cut tensor is put together from its pieces: the piece at coordinates c (over its cuts, in
// row-major order) is in the part with c on those dimensions and 0 on the others.
at::Tensor CheckpointReader::whole(const std::string& what, const std::string& key) const {
  std::string file = what;  // the part being read when a failure comes (set by assemble)
  return classify(file, [&] { return assemble(what, key, &file); });
}

at::Tensor CheckpointReader::assemble(const std::string& what, const std::string& key, std::string* file_read) const {
  const std::vector<Part>& ps = parts(what);
  const std::string name = state_param(key, meta_.layouts);
  auto lookup = [&](size_t part) {
    const Part& pt = ps.at(part);
    *file_read = pt.name;
    auto it = pt.tensors.find(key);
    VIDIT_CHECK(it != pt.tensors.end(), "checkpoint '", dir_, "': part ", part, " of ", what, " lacks '", key, "'");
    // What is read is verified against the manifest's checksum (open() found every file in it).
    const auto& sums = sums_.at(pt.name);
    auto sum = sums.find(key);
    VIDIT_CHECK(sum != sums.end(), "checkpoint '", dir_, "': the manifest has no checksum of '", key, "' in ", pt.name);
    VIDIT_CHECK(checksum(it->second) == sum->second, "checkpoint '", dir_, "': '", key, "' in ", pt.name,
                " does not match its checksum (the file was corrupted after it was written)");
    return it->second;
  };
  // Once copied out, the tensor's pages of the mapped part files are let go: reading a
  // checkpoint a tensor at a time never keeps the whole file resident in this process.
  auto copied = [](const at::Tensor& view, at::Tensor out) {
    release_mapped_pages(view.data_ptr(), size_t(view.nbytes()));
    return out;
  };
  if (name.empty() || meta_.layouts.at(name).cuts.empty()) {
    const at::Tensor view = lookup(0);
    return copied(view, view.clone());
  }
  const Layout& l = meta_.layouts.at(name);
  int64_t pieces = 1;
  for (const Cut& c : l.cuts) pieces *= c.degree;
  std::vector<at::Tensor> parts;
  for (int64_t p = 0; p < pieces; ++p) {
    // Coordinates of piece p over the cuts, then the part index over the parts' dimensions.
    std::map<std::string, int> coord;
    int64_t rest = p;
    for (size_t i = l.cuts.size(); i-- > 0;) coord[l.cuts[i].over] = int(rest % l.cuts[i].degree), rest /= l.cuts[i].degree;
    int64_t index = 0;
    for (size_t i = 0; i < meta_.part.dims.size(); ++i) {
      auto it = coord.find(meta_.part.dims[i]);
      index = index * meta_.part.degrees[i] + (it == coord.end() ? 0 : it->second);
    }
    parts.push_back(lookup(size_t(index)));
  }
  VIDIT_CHECK(parts[0].sizes().vec() == l.local_shape() || l.cuts.back().kind == Cut::Kind::Flat, "checkpoint '",
              dir_, "': '", key, "' is stored as ", parts[0].sizes(), " but its layout gives parts of ",
              c10::IntArrayRef(l.local_shape()));
  try {
    at::Tensor out = join_parts(l, parts);
    for (const at::Tensor& view : parts) release_mapped_pages(view.data_ptr(), size_t(view.nbytes()));
    return out;
  } catch (const Error& e) {
    fail("checkpoint '", dir_, "': ", what, " '", key, "': ", e.what());
  }
}

TensorMap CheckpointReader::shapes(const std::string& what) const {
  TensorMap out;
  for (const auto& [key, t] : parts(what)[0].tensors) {
    const std::string name = state_param(key, meta_.layouts);
    const std::vector<int64_t> shape = name.empty() ? t.sizes().vec() : meta_.layouts.at(name).shape;
    out[key] = at::empty(shape, at::TensorOptions().dtype(t.scalar_type()).device(at::kMeta));
  }
  return out;
}

CheckpointState load_checkpoint(const std::string& dir) {
  CheckpointReader r(dir);
  CheckpointState s = r.meta();
  for (const auto& key : r.keys("model")) s.model[key] = r.whole("model", key);
  if (r.has("ema"))
    for (const auto& key : r.keys("ema")) s.ema[key] = r.whole("ema", key);
  for (const auto& key : r.keys("optimizer")) s.optimizer[key] = r.whole("optimizer", key);
  return s;
}

}  // namespace vidit

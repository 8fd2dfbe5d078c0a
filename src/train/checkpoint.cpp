#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

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
#include <thread>
#include <chrono>

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

std::string sums_name(int64_t index, int64_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "sums.part-%05lld-of-%05lld.json", (long long)index, (long long)count);
  return name;
}

// Writes `tensors` to `path` and fsyncs it; returns where the tensors' bytes begin.
uint64_t write_file(Storage& storage, const std::string& path, const TensorMap& tensors) {
  std::unique_ptr<WritableFile> f = storage.create(path);
  const uint64_t data_start = write_safetensors(*f, tensors);
  f->sync();
  f->close();
  return data_start;
}

// Reads the file written by write_file back and checks every byte against what was meant to be
// written; returns the file's entry of the manifest (its size, each tensor's checksum, of the
// bytes read back). The read-back streams the file through one buffer (read(2), not a mapping:
// page faults over gigabytes cost more than the copy), compares each chunk with the tensor's
// memory and hashes it while it is in cache: one pass over the state besides the write. A
// tensor that is not finite fails the file (so the part, so the save): a non-finite state is
// never committed. (A sum in double is finite exactly when every value is: fp32's largest times
// any tensor's size stays far below double's range.)
nlohmann::json verify_file(const std::string& path, const TensorMap& tensors, uint64_t data_start, int64_t step) {
  std::vector<std::pair<std::string, at::Tensor>> order;  // the file's order (the map's), CPU, contiguous
  for (const auto& [key, t] : tensors) order.emplace_back(key, t.detach().to(at::kCPU).contiguous());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  VIDIT_CHECK(fd >= 0, "checkpoint part '", path, "' cannot be read back: ", std::strerror(errno));
  std::vector<char> buf(8 << 20);
  XXH3_state_t* state = XXH3_createState();
  nlohmann::json sums = nlohmann::json::object();
  uint64_t at = data_start;
  try {
    for (const auto& [key, t] : order) {
      VIDIT_CHECK(!t.is_floating_point() || std::isfinite(t.sum(at::kDouble).item<double>()), "refusing to save step ",
                  step, ": the training state is not finite ('", key, "' in ", path,
                  "); the last good checkpoint is kept. Lower train.lr or raise train.warmup_steps");
      XXH3_64bits_reset(state);
      const char* want = static_cast<const char*>(t.data_ptr());
      const uint64_t bytes = uint64_t(t.numel()) * t.element_size();
      for (uint64_t done = 0; done < bytes;) {
        const ssize_t n = ::pread(fd, buf.data(), size_t(std::min<uint64_t>(bytes - done, buf.size())), off_t(at));
        VIDIT_CHECK(n > 0, "checkpoint part '", path, "' reads back short at byte ", at, " (",
                    n < 0 ? std::strerror(errno) : "end of file", "): the storage lost data");
        VIDIT_CHECK(std::memcmp(buf.data(), want + done, size_t(n)) == 0, "checkpoint part '", path, "': '", key,
                    "' reads back different from what was written (storage fault)");
        XXH3_64bits_update(state, buf.data(), size_t(n));
        at += uint64_t(n), done += uint64_t(n);
      }
      sums[key] = hex64(XXH3_64bits_digest(state));
    }
  } catch (...) {
    XXH3_freeState(state);
    ::close(fd);
    throw;
  }
  XXH3_freeState(state);
  ::close(fd);
  const uintmax_t size = fs::file_size(path);
  VIDIT_CHECK(size == at, "checkpoint part '", path, "' has ", size, " bytes, not the ", at, " written");
  return {{"bytes", size}, {"tensors", sums}};
}

std::string failed_name(int64_t index, int64_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "failed.part-%05lld-of-%05lld.txt", (long long)index, (long long)count);
  return name;
}

bool is_committed(const fs::path& dir) {
  const std::string n = dir.filename().string();
  return n.rfind("step_", 0) == 0 && n.find('.') == std::string::npos && fs::exists(dir / "meta.json");
}

int64_t step_of(const fs::path& dir) { return std::stoll(dir.filename().string().substr(5)); }

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
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step_", 0) == 0 && n.size() > 4 && n.substr(n.size() - 4) == ".tmp" &&
        !keep.count(n))
      storage.remove_all(e.path().string());
  }
  fs::path tmp = checkpoint_tmp_dir(out_dir, step);
  storage.create_dirs(tmp.string());
  return tmp.string();
}

uint64_t write_checkpoint_part(const std::string& tmp_dir, const CheckpointState& s, bool has_ema, Storage& storage) {
  fs::path tmp(tmp_dir);
  nlohmann::json files = nlohmann::json::object();
  uint64_t bytes = 0;
  // The files one after another, the largest first; each one is read back and verified on a
  // second thread while the next is written, so the disk never waits for a verification and
  // only the last (smallest) file's read-back is not hidden.
  std::vector<std::pair<std::string, const TensorMap*>> todo = {{"optimizer", &s.optimizer}, {"model", &s.model}};
  if (has_ema) todo.insert(todo.begin() + 1, {"ema", &s.ema});
  std::future<nlohmann::json> verifying;
  std::string verifying_file;
  auto collect = [&] {
    if (!verifying.valid()) return;
    files[verifying_file] = verifying.get();  // rethrows what the verification threw
    bytes += files[verifying_file].at("bytes").get<uint64_t>();
  };
  for (const auto& [what, m] : todo) {
    const std::string file = part_name(what.c_str(), s.part.index, s.part.count()), path = (tmp / file).string();
    const uint64_t data_start = write_file(storage, path, *m);
    collect();
    verifying_file = file;
    verifying = std::async(std::launch::async, [path, m, data_start, step = s.step] {
      return verify_file(path, *m, data_start, step);
    });
  }
  collect();
  // This part's entries of the manifest: written last, so its presence means the part is done.
  storage.write_atomic((tmp / sums_name(s.part.index, s.part.count())).string(), files.dump());
  return bytes;
}

void fail_checkpoint_part(const std::string& tmp_dir, const CheckpointPart& part, const std::string& why,
                          Storage& storage) {
  try {
    storage.write_atomic((fs::path(tmp_dir) / failed_name(part.index, part.count())).string(), why + "\n");
  } catch (const std::exception&) {
    // The storage that failed the part may fail this too: the commit then waits out its time.
  }
}

std::string commit_checkpoint(const std::string& out_dir, const CheckpointState& s, int64_t keep, int64_t keep_every,
                              Storage& storage, double wait_s) {
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
  // writer. Committed only when every part is there with the size its writer recorded.
  nlohmann::json manifest = {{"parts", s.part.count()}, {"files", nlohmann::json::object()}};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  for (int64_t i = 0; i < s.part.count(); ++i) {
    const fs::path sums = tmp / sums_name(i, s.part.count()), failed = tmp / failed_name(i, s.part.count());
    // Parts written by other ranks' writers come when they come: wait for each (or its failure).
    while (!fs::exists(sums) && !fs::exists(failed) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (fs::exists(failed)) {
      std::ifstream why(failed);
      std::string line;
      std::getline(why, line);
      fail("checkpoint '", tmp.string(), "': part ", i, " of ", s.part.count(), " failed on its writer: ", line);
    }
    std::ifstream in(sums);
    VIDIT_CHECK(in, "checkpoint '", tmp.string(), "': part ", i, " of ", s.part.count(), " was not written",
                wait_s > 0 ? " within train.ckpt_timeout_s (" + std::to_string(int64_t(wait_s)) + " s)" : std::string(),
                " (no ", sums.filename().string(), "): not committing it");
    nlohmann::json part;
    try {
      in >> part;
    } catch (const nlohmann::json::exception& e) {
      fail("checkpoint '", sums.string(), "' is malformed: ", e.what());
    }
    for (const auto& [file, entry] : part.items()) {
      VIDIT_CHECK(fs::exists(tmp / file) && fs::file_size(tmp / file) == entry.at("bytes").get<uintmax_t>(),
                  "checkpoint '", tmp.string(), "': ", file, " is missing or not the size its writer recorded");
      manifest["files"][file] = entry;
    }
  }
  storage.write_atomic((tmp / "manifest.json").string(), manifest.dump(1));
  storage.write_atomic((tmp / "meta.json").string(), meta.dump(2));
  // Re-saving a step that exists: the old one stays until the new one is in place.
  const fs::path old = root / (name + ".old");
  storage.remove_all(old.string());
  if (fs::exists(final_dir)) storage.rename(final_dir.string(), old.string());
  storage.rename(tmp.string(), final_dir.string());
  storage.sync_dir(root.string());
  storage.write_atomic((root / "latest").string(), name + "\n");
  storage.remove_all(old.string());

  // Retention: the newest `keep` committed checkpoints, and every `keep_every`-th step; the one
  // just written is always among them.
  std::vector<fs::path> all;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && is_committed(e.path())) all.push_back(e.path());
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i + keep < all.size(); ++i)
    if (all[i] != final_dir && !(keep_every > 0 && step_of(all[i]) % keep_every == 0)) storage.remove_all(all[i].string());
  return final_dir.string();
}

std::string save_checkpoint(const std::string& out_dir, const CheckpointState& s, int64_t keep) {
  VIDIT_CHECK(s.part.count() == 1, "save_checkpoint writes states of one part");
  write_checkpoint_part(begin_checkpoint(out_dir, s.step, local_storage()), s, !s.ema.empty(), local_storage());
  return commit_checkpoint(out_dir, s, keep, 0, local_storage(), 0);
}

std::vector<std::string> checkpoint_candidates(const std::string& out_dir) {
  const fs::path root = fs::path(out_dir) / "checkpoints";
  std::vector<std::string> out;
  if (!fs::is_directory(root)) return out;
  // Every committed checkpoint (meta.json is written last, after the manifest), newest first.
  // `latest` names the newest too, but is not needed: a missing or stale pointer (a crash
  // between the rename and its update) changes nothing.
  std::vector<fs::path> all;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && is_committed(e.path())) all.push_back(e.path());
  std::sort(all.begin(), all.end(), [](const fs::path& a, const fs::path& b) { return step_of(a) > step_of(b); });
  for (const auto& d : all) out.push_back(d.string());
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& out_dir) {
  const std::vector<std::string> all = checkpoint_candidates(out_dir);
  if (all.empty()) return std::nullopt;
  return all[0];
}

std::string set_aside_checkpoint(const std::string& dir) {
  fs::path bad = dir + ".corrupt";
  fs::remove_all(bad);
  fs::rename(dir, bad);
  return bad.string();
}

struct CheckpointReader::Part {
  std::string name;  // file name in the directory
  std::unique_ptr<MappedFile> file;
  TensorMap tensors;  // views into the mapping
};

namespace {
// Runs `f`, turning every failure into CheckpointCorrupt.
template <class F>
auto as_corrupt(F&& f) {
  try {
    return f();
  } catch (const CheckpointCorrupt&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointCorrupt(e.what());
  } catch (const std::exception& e) {
    throw CheckpointCorrupt(e.what());
  }
}
}  // namespace

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  as_corrupt([&] { open(); });
}

void CheckpointReader::open() {
  const std::string& dir = dir_;
  fs::path d(dir);
  CheckpointState& s = meta_;
  std::ifstream in(d / "meta.json");
  VIDIT_CHECK(in, "checkpoint '", dir, "' has no meta.json: it is incomplete or not a checkpoint");
  // Each kind's files by part index.
  std::function<std::string(const std::string&, int64_t)> file_of;
  int64_t count = 1;
  try {
    nlohmann::json meta;
    in >> meta;
    s.step = meta.at("step").get<int64_t>();
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
  nlohmann::json manifest;
  if (fs::exists(d / "manifest.json")) {
    std::ifstream m(d / "manifest.json");
    try {
      m >> manifest;
      for (const auto& [file, entry] : manifest.at("files").items()) {
        const uintmax_t bytes = entry.at("bytes").get<uintmax_t>();
        VIDIT_CHECK(fs::exists(d / file) && fs::file_size(d / file) == bytes, "checkpoint '", dir, "': ", file,
                    fs::exists(d / file) ? " has " + std::to_string(fs::file_size(d / file)) + " bytes, the manifest says " +
                                               std::to_string(bytes) + " (truncated or overwritten)"
                                         : std::string(" is missing"));
        for (const auto& [key, sum] : entry.at("tensors").items()) sums_[file][key] = sum.get<std::string>();
      }
    } catch (const nlohmann::json::exception& e) {
      fail("checkpoint '", (d / "manifest.json").string(), "' is malformed: ", e.what());
    }
  }
  for (const char* what : {"model", "ema", "optimizer"}) {
    if (std::string(what) == "ema" && !fs::exists(d / file_of(what, 0))) continue;  // saved without EMA
    std::vector<Part>& parts = parts_[what];
    for (int64_t i = 0; i < count; ++i) {
      const fs::path f = d / file_of(what, i);
      VIDIT_CHECK(fs::exists(f), "checkpoint '", dir, "' lacks ", f.filename().string(),
                  count > 1 ? " (" + std::to_string(count) + " parts expected)" : std::string(),
                  ": it was not saved completely");
      Part p;
      p.name = f.filename().string();
      p.file = std::make_unique<MappedFile>(f.string(), "checkpoint file");
      p.tensors = view_safetensors(p.file->data(), p.file->size(), f.string());
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
  return as_corrupt([&] { return assemble(what, key); });
}

at::Tensor CheckpointReader::assemble(const std::string& what, const std::string& key) const {
  const std::vector<Part>& ps = parts(what);
  const std::string name = state_param(key, meta_.layouts);
  auto lookup = [&](size_t part) {
    const Part& pt = ps.at(part);
    auto it = pt.tensors.find(key);
    VIDIT_CHECK(it != pt.tensors.end(), "checkpoint '", dir_, "': part ", part, " of ", what, " lacks '", key, "'");
    // What is read is verified against the manifest's checksum.
    auto file = sums_.find(pt.name);
    if (file != sums_.end()) {
      auto sum = file->second.find(key);
      VIDIT_CHECK(sum != file->second.end(), "checkpoint '", dir_, "': the manifest has no checksum of '", key,
                  "' in ", pt.name);
      VIDIT_CHECK(checksum(it->second) == sum->second, "checkpoint '", dir_, "': '", key, "' in ", pt.name,
                  " does not match its checksum (the file was corrupted after it was written)");
    }
    return it->second;
  };
  if (name.empty() || meta_.layouts.at(name).cuts.empty()) return lookup(0).clone();
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
    return join_parts(l, parts);
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

#include "prepare/caption_store.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/safetensors.h"
#include "prepare/provenance.h"
#include "text/text_encoder.h"

namespace vidit {

namespace fs = std::filesystem;

namespace {

std::string caption_hash(const std::string& caption) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)XXH3_64bits(caption.data(), caption.size()));
  return buf;
}

// Captions per file of the store (and per call of the encoder's batching).
constexpr size_t kCaptionsPerFile = 256;

// A worker's index: {"encoder": identity, "captions": {hash: file}}; a store written before the
// encoder was recorded holds the captions map alone (encoder "": judged by what it recorded).
struct StoreIndex {
  std::string encoder;
  nlohmann::json captions;
};

StoreIndex read_store_index(const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  if (j.contains("captions") && j.contains("encoder")) return {j.at("encoder").get<std::string>(), j.at("captions")};
  return {"", j};
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

struct CaptionStore::State {
  std::string dir;
  std::map<std::string, std::string> file_of;    // caption hash -> file
  std::map<std::string, std::string> failed;     // caption hash -> why
  std::string open_file;                          // the file last read, kept in memory
  TensorMap open_tensors;
};

CaptionStore CaptionStore::build(const Config& cfg, const std::vector<std::string>& captions, int worker,
                                 CaptionStoreReport* report) {
  const auto t0 = std::chrono::steady_clock::now();
  CaptionStore store;
  store.state_ = std::make_shared<State>();
  State& st = *store.state_;
  st.dir = cfg.data.cache_dir + "/text";
  fs::create_directories(st.dir);
  const std::string index_path = st.dir + "/w" + std::to_string(worker) + ".index.json";
  // Which encoder made an embedding is part of it: an index made by another encoder (weights,
  // tokenizer, dtype, text_len) is not used, so a changed text.encoder embeds every caption again.
  const std::string encoder = text_encoder_identity(cfg);
  int64_t other_encoder = 0;
  // Every worker's index: a caption another slice embedded is not embedded again.
  for (const auto& e : fs::directory_iterator(st.dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() < 11 || name.substr(name.size() - 11) != ".index.json") continue;
    try {
      const StoreIndex index = read_store_index(e.path().string());
      if (index.encoder != encoder && !index.encoder.empty()) {
        other_encoder += int64_t(index.captions.size());
        continue;
      }
      for (auto& [h, f] : index.captions.items())
        if (fs::exists(st.dir + "/" + f.get<std::string>())) st.file_of[h] = st.dir + "/" + f.get<std::string>();
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "warning: %s is unreadable (%s): its captions are embedded again\n", e.path().c_str(), ex.what());
    }
  }
  if (other_encoder > 0)
    std::printf("[prepare] %lld captions in %s were embedded by another text encoder: embedded again\n",
                (long long)other_encoder, st.dir.c_str());
  StoreIndex own{encoder, nlohmann::json::object()};
  if (fs::exists(index_path)) {
    try {
      StoreIndex was = read_store_index(index_path);
      if (was.encoder == encoder || was.encoder.empty()) own.captions = was.captions;
    } catch (const std::exception&) {
    }
  }

  std::vector<std::string> todo;
  std::set<std::string> seen;
  for (const auto& c : captions) {
    const std::string h = caption_hash(c);
    if (!seen.insert(h).second) continue;
    if (!st.file_of.count(h)) todo.push_back(c);
  }
  const std::string null_path = st.dir + "/null.safetensors", null_encoder = st.dir + "/null.encoder";
  const bool need_null =
      worker == 0 && (!fs::exists(null_path) || (fs::exists(null_encoder) && read_text(null_encoder) != encoder));
  CaptionStoreReport rep;
  rep.captions = int64_t(seen.size());
  if (!todo.empty() || need_null) {
    text::TextEncoderOptions opt = text::text_encoder_options(cfg);
    text::TextEncoder enc(opt);
    VIDIT_CHECK(enc.dim() == cfg.model.text_dim, "text.encoder '", cfg.text.encoder, "' makes ", enc.dim(),
                "-wide embeddings but model.text_dim = ", cfg.model.text_dim, ": set model.text_dim = ", enc.dim());
    const at::ScalarType store_dtype = cfg.data.cache_dtype == Precision::bf16 ? at::kBFloat16 : at::kFloat;
    std::printf("[prepare] embedding %zu captions with umT5 (%s) on %s\n", todo.size(), cfg.text.encoder.c_str(),
                opt.device.str().c_str());
    std::fflush(stdout);
    int64_t file_no = 0;
    while (fs::exists(st.dir + "/w" + std::to_string(worker) + "-" + std::to_string(file_no) + ".safetensors")) ++file_no;
    for (size_t begin = 0; begin < todo.size(); begin += kCaptionsPerFile) {
      const std::vector<std::string> chunk(todo.begin() + begin, todo.begin() + std::min(todo.size(), begin + kCaptionsPerFile));
      std::vector<std::string> ok;
      text::EncodedCaptions e;
      try {
        e = enc.encode_captions(chunk);
        ok = chunk;
      } catch (const Error&) {
        // One bad caption (not UTF-8) must not cost the others: one at a time, naming the bad ones.
        std::vector<at::Tensor> rows;
        for (const auto& c : chunk) {
          try {
            text::EncodedCaptions one = enc.encode_captions({c});
            rows.push_back(one.embedding), ok.push_back(c);
            e.lengths.push_back(one.lengths[0]), e.truncated.push_back(one.truncated[0]);
          } catch (const Error& why) {
            st.failed[caption_hash(c)] = why.what();
            ++rep.failed;
          }
        }
        if (!rows.empty()) e.embedding = at::cat(rows);
      }
      if (ok.empty()) continue;
      TensorMap tensors;
      for (size_t i = 0; i < ok.size(); ++i) {
        tensors[caption_hash(ok[i])] = e.embedding[int64_t(i)].slice(0, 0, e.lengths[i]).to(store_dtype).contiguous();
        rep.truncated += e.truncated[i];
      }
      const std::string name = "w" + std::to_string(worker) + "-" + std::to_string(file_no++) + ".safetensors";
      save_safetensors(st.dir + "/" + name, tensors);
      for (const auto& c : ok) {
        own.captions[caption_hash(c)] = name;
        st.file_of[caption_hash(c)] = st.dir + "/" + name;
      }
      // After each file: a rerun keeps what is done.
      write_file_atomic(index_path, nlohmann::json{{"encoder", own.encoder}, {"captions", own.captions}}.dump());
      rep.embedded += int64_t(ok.size());
      std::printf("[prepare] captions %lld / %zu embedded\n", (long long)rep.embedded, todo.size());
      std::fflush(stdout);
    }
    if (need_null) {
      std::vector<std::string> extra = {""};
      if (!cfg.sample.negative_prompt.empty()) extra.push_back(cfg.sample.negative_prompt);
      text::EncodedCaptions n = enc.encode_captions(extra);
      TensorMap t{{"text", n.embedding[0].slice(0, 0, n.lengths[0]).to(store_dtype).contiguous()}};
      if (extra.size() > 1) t["negative"] = n.embedding[1].slice(0, 0, n.lengths[1]).to(store_dtype).contiguous();
      save_safetensors(null_path, t);
      write_file_atomic(null_encoder, encoder);
    }
  }  // the encoder is freed here, before any VAE exists
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (report) *report = rep;
  return store;
}

at::Tensor CaptionStore::lookup(const std::string& caption) {
  State& st = *state_;
  const std::string h = caption_hash(caption);
  auto bad = st.failed.find(h);
  VIDIT_CHECK(bad == st.failed.end(), "the caption could not be embedded: ", bad == st.failed.end() ? "" : bad->second);
  auto it = st.file_of.find(h);
  VIDIT_CHECK(it != st.file_of.end(), "caption '", caption.substr(0, 60), "' is not in the caption store ", st.dir);
  if (st.open_file != it->second) {
    st.open_tensors = load_safetensors(it->second);
    st.open_file = it->second;
  }
  auto t = st.open_tensors.find(h);
  VIDIT_CHECK(t != st.open_tensors.end(), "caption store file '", it->second, "' lacks caption ", h,
              ": delete it and its index (", st.dir, "/w*.index.json) and run vidit prepare again");
  return t->second;
}

CaptionEncoder CaptionStore::encoder() const {
  CaptionStore self = *this;
  return [self](const std::string& caption) mutable { return self.lookup(caption); };
}

at::Tensor cached_null_text(const std::string& cache_dir, int64_t text_len) {
  const std::string path = cache_dir + "/text/null.safetensors";
  if (cache_dir.empty() || !fs::exists(path)) return {};
  at::Tensor t = load_safetensors(path).at("text").to(at::kFloat);
  VIDIT_CHECK(t.dim() == 2 && t.size(0) <= text_len, path, ": the null text has shape ", t.sizes(),
              "; the model takes at most ", text_len, " tokens");
  return at::cat({t, at::zeros({text_len - t.size(0), t.size(1)})});
}

}  // namespace vidit

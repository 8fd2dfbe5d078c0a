// A transformer and a release's other components as one release folder: diffusers' pipeline layout, or
// Wan 2.2's own two-expert layout (see the header).
#include "pipeline/pipeline_export.h"

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "diffusion/frame_condition.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/experts.h"
#include "model/weight_layout.h"

namespace vidit {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json read_json(const fs::path& path) {
  std::ifstream in(path);
  VIDIT_CHECK(in, "cannot read '", path.string(), "'");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("'", path.string(), "' is not valid JSON: ", e.what());
  }
}

// A component entry of model_index.json: ["library", "Class"], or [null, null] for none.
bool names_a_component(const json& v) { return v.is_array() && v.size() == 2 && v[0].is_string() && v[1].is_string(); }

// The file `from` made again at `to`: hard-linked, else (another file system, or links not
// allowed) copied; counted in the report.
void link_file(const fs::path& from, const fs::path& to, PipelineExport& report) {
  const fs::path source = fs::canonical(from);
  const uint64_t bytes = fs::file_size(source);
  std::error_code ec;
  fs::create_hard_link(source, to, ec);
  if (!ec) {
    ++report.linked_files, report.linked_bytes += bytes;
    return;
  }
  fs::copy_file(source, to);
  ++report.copied_files, report.copied_bytes += bytes;
}

// Every file under `from` (links followed) made again under `to`: hard-linked, else copied.
void link_tree(const fs::path& from, const fs::path& to, PipelineExport& report) {
  fs::create_directories(to);
  for (auto it = fs::recursive_directory_iterator(from, fs::directory_options::follow_directory_symlink);
       it != fs::recursive_directory_iterator(); ++it) {
    const fs::path rel = fs::relative(it->path(), from);
    if (it->is_directory()) {
      fs::create_directories(to / rel);
      continue;
    }
    if (it->is_regular_file()) link_file(it->path(), to / rel, report);
  }
}

// `out` made by `fill` in a sibling folder renamed into place when whole; `out` must not exist, or
// be an empty folder. A failure removes the sibling and leaves `out` as it was.
void build_folder(const std::string& out, const std::function<void(const fs::path&)>& fill) {
  const fs::path target = fs::path(out).lexically_normal().has_filename() ? fs::path(out).lexically_normal()
                                                                          : fs::path(out).lexically_normal().parent_path();
  if (fs::exists(target))
    VIDIT_CHECK(fs::is_directory(target) && fs::is_empty(target), "vidit export: '", target.string(),
                "' exists and is not an empty folder; give a new folder (nothing there was changed)");
  const fs::path tmp = target.parent_path() / (target.filename().string() + ".tmp-" + std::to_string(::getpid()));
  try {
    if (!target.parent_path().empty()) fs::create_directories(target.parent_path());
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    fill(tmp);
    if (fs::exists(target)) fs::remove(target);  // empty (checked above)
    fs::rename(tmp, target);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace

std::string pipeline_class_for(const ModelConfig& m) {
  return m.condition == FrameCondition::none ? "WanPipeline" : "WanImageToVideoPipeline";
}

PipelineExport write_diffusers_pipeline(const TensorStream& official, const ModelConfig& m, const std::string& release,
                                        const std::string& out, uint64_t max_shard_bytes, Expert expert) {
  const fs::path base(release), index_path = base / "model_index.json";
  VIDIT_CHECK(fs::is_regular_file(index_path), "--pipeline '", release, "' has no model_index.json: give a release in "
              "diffusers' layout (a folder WanPipeline.from_pretrained opens) whose components go with the model");
  json index = read_json(index_path);
  PipelineExport report;
  report.pipeline_class = index.value("_class_name", std::string());
  const std::string wanted = pipeline_class_for(m);
  const bool i2v = m.condition != FrameCondition::none;
  // Wan 2.2 TI2V keeps its first frame in the latent: its release samples text with WanPipeline
  // and a picture with WanImageToVideoPipeline, either asking for a timestep per token.
  const bool keeps_first = fuses_first_frame(m);
  VIDIT_CHECK(!keeps_first || index.value("expand_timesteps", false) == true, "--pipeline '", release, "': the run's "
              "model keeps its first frame in the latent (Wan 2.2 TI2V), but the release's model_index.json does not "
              "set expand_timesteps, so its pipelines would not sample it so; give the TI2V release it was trained from");
  VIDIT_CHECK(report.pipeline_class == wanted || (keeps_first && report.pipeline_class == "WanPipeline"), "--pipeline '", release, "' is a ", report.pipeline_class.empty() ?
              std::string("pipeline without _class_name") : report.pipeline_class, ", but the checkpoint's model ",
              i2v ? "is image-to-video (model.condition = \"" + std::string(name_of(m.condition)) + "\", " +
                        std::to_string(m.in_channels) + " input channels)"
                  : "is text-to-video (" + std::to_string(m.in_channels) + " input channels)",
              ", whose release is a ", wanted, "; give a ", wanted, " release");
  const std::optional<ExpertRelease> experts = find_experts(release);
  VIDIT_CHECK(experts || expert == Expert::none, "--pipeline '", release, "' holds one transformer, but the run "
              "trained the ", name_of(expert), "-noise expert of a two-expert model (train.expert); give the "
              "two-expert release it was trained from");
  VIDIT_CHECK(!experts || expert != Expert::none, "--pipeline '", release, "' holds two experts (transformer/ and "
              "transformer_2/), but the run trained one model (train.expert = \"none\"); give a one-transformer "
              "release");
  if (experts) {
    VIDIT_CHECK(experts->boundary == m.boundary, "--pipeline '", release, "' splits its experts at ", experts->boundary,
                " but the run's model.boundary is ", m.boundary, ": its expert was trained for other noise levels");
    report.transformer = expert == Expert::high ? "transformer" : "transformer_2";
  }
  if (fs::exists(base / report.transformer / "config.json")) {
    const ModelConfig r = read_transformer_config((base / report.transformer).string());
    auto same = [&](const char* key, int64_t ours, int64_t theirs, const char* part) {
      VIDIT_CHECK(ours == theirs, "--pipeline '", release, "': its transformer has ", key, " = ", theirs,
                  " but the checkpoint's model has ", ours, ", so its ", part, " does not go with this model; give "
                  "the release the run was trained from");
    };
    same("model.in_channels", m.in_channels, r.in_channels, "VAE and conditioning");
    same("model.out_channels", m.out_channels, r.out_channels, "VAE");
    same("model.text_dim", m.text_dim, r.text_dim, "text encoder");
    same("model.image_dim", m.image_dim, r.image_dim, "image encoder");
  }
  for (const char* part : {"vae", "scheduler"})
    VIDIT_CHECK(index.contains(part) && names_a_component(index[part]) && fs::is_directory(base / part), "--pipeline '",
                release, "' has no ", part, "/ component; a pipeline needs one");
  VIDIT_CHECK(m.image_dim == 0 || (index.contains("image_encoder") && names_a_component(index["image_encoder"])),
              "--pipeline '", release, "' has no image_encoder, but the model attends to CLIP features (model.image_dim"
              " = ", m.image_dim, ")");
  for (const auto& [name, value] : index.items()) {
    if (name == report.transformer || !names_a_component(value)) continue;
    VIDIT_CHECK(fs::is_directory(base / name), "--pipeline '", release, "': model_index.json names the component '",
                name, "' but there is no ", name, "/ folder");
    report.components.push_back(name);
  }

  build_folder(out, [&](const fs::path& tmp) {
    write_diffusers_transformer(official, m, (tmp / report.transformer).string(), max_shard_bytes);
    for (const std::string& part : report.components) link_tree(base / part, tmp / part, report);
    index[report.transformer] = json::array({"diffusers", "WanTransformer3DModel"});
    write_file_atomic((tmp / "model_index.json").string(), index.dump(2) + "\n");
  });
  return report;
}

PipelineExport write_official_expert_release(const TensorStream& official, const ModelConfig& m,
                                            const std::string& release, const std::string& out,
                                            uint64_t max_shard_bytes, Expert expert) {
  const fs::path base(release);
  const std::optional<ExpertRelease> experts = find_experts(release);
  VIDIT_CHECK(experts && fs::is_directory(base / "high_noise_model"), "--pipeline '", release, "' has no "
              "model_index.json and is not an official two-expert release (high_noise_model/, low_noise_model/): give "
              "a release in diffusers' layout or Wan 2.2's own");
  VIDIT_CHECK(expert != Expert::none, "--pipeline '", release, "' holds two experts, but the run trained one model "
              "(train.expert = \"none\"); give a one-transformer release");
  VIDIT_CHECK(experts->boundary == m.boundary, "--pipeline '", release, "' splits its experts at ", experts->boundary,
              " but the run's model.boundary is ", m.boundary, ": its expert was trained for other noise levels");
  PipelineExport report;
  report.pipeline_class = "Wan 2.2 official";
  report.transformer = expert == Expert::high ? "high_noise_model" : "low_noise_model";
  const ModelConfig& r = experts->model;
  auto same = [&](const char* key, int64_t ours, int64_t theirs) {
    VIDIT_CHECK(ours == theirs, "--pipeline '", release, "': its experts have ", key, " = ", theirs,
                " but the checkpoint's model has ", ours, "; give the release the run was trained from");
  };
  same("model.dim", m.dim, r.dim), same("model.ffn_dim", m.ffn_dim, r.ffn_dim), same("model.layers", m.layers, r.layers);
  same("model.heads", m.heads, r.heads), same("model.in_channels", m.in_channels, r.in_channels);
  same("model.out_channels", m.out_channels, r.out_channels), same("model.text_dim", m.text_dim, r.text_dim);
  const fs::path own_config = base / report.transformer / "config.json";
  const fs::path whole_base = fs::weakly_canonical(base), whole_out = fs::weakly_canonical(out);
  VIDIT_CHECK(whole_out.string().rfind(whole_base.string() + "/", 0) != 0, "vidit export: '", out, "' lies inside the "
              "release '", release, "', whose every file is linked into it; give a folder outside the release");
  build_folder(out, [&](const fs::path& tmp) {
    // The expert under official names; the release's own config.json kept beside it (the shape
    // checked above), so Wan's code reads the folder as it read the release's.
    write_wan_transformer(official, m, (tmp / report.transformer).string(), max_shard_bytes);
    if (fs::is_regular_file(own_config)) {
      fs::remove(tmp / report.transformer / "config.json");
      link_file(own_config, tmp / report.transformer / "config.json", report);
    }
    for (const auto& entry : fs::directory_iterator(base)) {
      const std::string name = entry.path().filename().string();
      if (name == report.transformer) continue;
      report.components.push_back(name);
      if (entry.is_directory()) {
        link_tree(entry.path(), tmp / name, report);
      } else if (entry.is_regular_file()) {
        link_file(entry.path(), tmp / name, report);
      }
    }
  });
  return report;
}

}  // namespace vidit

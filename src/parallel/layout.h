// Parameter layouts: how the tensor one rank holds relates to the whole parameter, described once
// per parameter as a list of cuts (a small DTensor-like placement list). A parameter no cut
// names is replicated: every rank holds it whole. The cuts apply in order:
//   Split   along tensor dimension `dim` in `degree` equal parts over mesh group `over`; member c
//           holds part c (tensor parallel: heads, MLP units);
//   Flat    the tensor so far flattened, zero-padded to a multiple of `degree` and cut in
//           `degree` equal chunks over `over` (FSDP shards).
// The parameter's gradient, AdamW moments and EMA weight have its layout. Everything that needs
// to know where a parameter's values are reads layouts and names no parallelism: cutting whole
// tensors to this rank's part (loading a checkpoint at any mesh), gathering whole ones
// (sampling, exporting), the global gradient norm, writing and reading checkpoints in parts, and
// `vidit plan`'s memory per rank.
//
// Training state keys name a parameter directly or behind a prefix ("exp_avg/<name>",
// "exp_avg_sq/<name>"); state_param() is the one place that reads them.
#pragma once
#include <functional>
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "model/init.h"

namespace vidit {

class Mesh;

struct Cut {
  enum class Kind { Split, Flat };
  Kind kind = Kind::Split;
  std::string over;  // the mesh group it is cut over ("tensor", "shard", ...)
  int dim = 0;       // Split: the tensor dimension
  int degree = 1;    // parts
  bool operator==(const Cut&) const = default;
};

struct Layout {
  std::vector<int64_t> shape;  // the whole parameter
  std::vector<Cut> cuts;       // in the order they apply; empty: replicated
  bool cut_over(const std::string& group) const;
  // The shape after the first `n` cuts (n = cuts.size(): what one rank holds).
  std::vector<int64_t> shape_after(size_t n) const;
  std::vector<int64_t> local_shape() const { return shape_after(cuts.size()); }
  bool operator==(const Layout&) const = default;
};
using Layouts = std::map<std::string, Layout>;

// Which checkpoint part a rank writes: parts are numbered row-major over `dims` (the mesh
// groups some parameter is cut over, in mesh order) with `degrees`; a rank whose coordinates on
// every other mesh dimension are 0 writes part `index`, the others write nothing.
struct CheckpointPart {
  std::vector<std::string> dims;
  std::vector<int> degrees;
  int index = 0;
  int count() const;
};

// Replicated layouts of `params` (their shapes, no cuts).
Layouts replicated_layouts(const TensorMap& params);

// The parameter a state key names ("<name>" or "<prefix>/<name>"), or "" when it names none.
std::string state_param(const std::string& key, const Layouts& layouts);

// Cut: part `coords[i]` of cut i. Not collective.
at::Tensor cut_part(const Layout& layout, const at::Tensor& whole, const std::vector<int>& coords);
// This rank's part of a whole tensor (its coordinates in the cuts' groups).
at::Tensor local_part(const Layout& layout, const at::Tensor& whole, const Mesh& mesh);
// Which elements of the whole parameter the part at `coords` holds, from the shapes alone: what
// a rank initialises without the rest (model/init.h). A Flat cut must be the last.
TensorRegion part_region(const Layout& layout, const std::vector<int>& coords);
// This rank's (its coordinates in the cuts' groups).
TensorRegion local_region(const Layout& layout, const Mesh& mesh);
// The whole tensor from `parts[i]` = the part at coordinates (i in row-major order over the
// cuts' degrees): what a checkpoint's files hold.
at::Tensor join_parts(const Layout& layout, const std::vector<at::Tensor>& parts);
// The whole tensor from every rank's local part: all-gathers over each cut's group, last cut
// first. Collective over those groups.
at::Tensor gather_whole(const Layout& layout, const at::Tensor& local, const Mesh& mesh);

// The L2 norm of the whole tensors whose local parts are `tensors` (keyed by parameter name; a
// name without a layout counts as replicated): the parts' sums of squares are added over each
// group their parameter is cut over, so each part counts once. Collective over the mesh; one
// host synchronisation.
double global_norm(const TensorMap& tensors, const Layouts& layouts, const Mesh& mesh);
// The part of the model a parameter belongs to, for per-part gradient norms: "blocks.N" for a
// block's, else its top-level module ("head", "patch_embedding", ...).
std::string model_part(const std::string& param_name);
// The same per part of the model: `part_of` names the part of each tensor (e.g. "blocks.3"), and
// the result holds each part's norm. The same collectives as global_norm (one element more per
// part), so it costs no extra round.
std::map<std::string, double> global_norms_by_part(const TensorMap& tensors, const Layouts& layouts, const Mesh& mesh,
                                                   const std::function<std::string(const std::string&)>& part_of);

}  // namespace vidit

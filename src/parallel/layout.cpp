#include "parallel/layout.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "parallel/mesh.h"

namespace vidit {

bool Layout::cut_over(const std::string& group) const {
  for (const Cut& c : cuts)
    if (c.over == group) return true;
  return false;
}

std::vector<int64_t> Layout::shape_after(size_t n) const {
  std::vector<int64_t> s = shape;
  for (size_t i = 0; i < n && i < cuts.size(); ++i) {
    const Cut& c = cuts[i];
    if (c.kind == Cut::Kind::Split) {
      s[size_t(c.dim)] /= c.degree;
    } else {
      int64_t numel = 1;
      for (int64_t d : s) numel *= d;
      s = {(numel + c.degree - 1) / c.degree};
    }
  }
  return s;
}

int CheckpointPart::count() const {
  int n = 1;
  for (int d : degrees) n *= d;
  return n;
}

Layouts replicated_layouts(const TensorMap& params) {
  Layouts out;
  for (const auto& [name, p] : params) out[name] = Layout{p.sizes().vec(), {}};
  return out;
}

std::string state_param(const std::string& key, const Layouts& layouts) {
  if (layouts.count(key)) return key;
  const size_t slash = key.find('/');
  if (slash != std::string::npos && layouts.count(key.substr(slash + 1))) return key.substr(slash + 1);
  return "";
}

at::Tensor cut_part(const Layout& layout, const at::Tensor& whole, const std::vector<int>& coords) {
  VIDIT_CHECK(whole.sizes().vec() == layout.shape, "a tensor of shape ", whole.sizes(), " was given for a parameter of shape ",
              c10::IntArrayRef(layout.shape));
  at::Tensor t = whole;
  for (size_t i = 0; i < layout.cuts.size(); ++i) {
    const Cut& c = layout.cuts[i];
    if (c.kind == Cut::Kind::Split) {
      const int64_t n = t.size(c.dim) / c.degree;
      t = t.narrow(c.dim, coords[i] * n, n);
    } else {
      // This member's chunk of the flattened tensor, the last one zero-padded: only the chunk is
      // read (the whole may be a memory-mapped file).
      const int64_t numel = t.numel(), chunk = (numel + c.degree - 1) / c.degree;
      const int64_t begin = std::min(numel, coords[i] * chunk), end = std::min(numel, begin + chunk);
      t = at::constant_pad_nd(t.reshape(-1).narrow(0, begin, end - begin), {0, chunk - (end - begin)});
    }
  }
  return t.clone();
}

at::Tensor local_part(const Layout& layout, const at::Tensor& whole, const Mesh& mesh) {
  std::vector<int> coords;
  for (const Cut& c : layout.cuts) coords.push_back(mesh.coord(c.over));
  return cut_part(layout, whole, coords);
}

TensorRegion part_region(const Layout& layout, const std::vector<int>& coords) {
  TensorRegion r = whole_region(layout.shape);
  r.offset.assign(layout.shape.size(), 0);
  r.length = layout.shape;
  for (size_t i = 0; i < layout.cuts.size(); ++i) {
    const Cut& c = layout.cuts[i];
    VIDIT_CHECK(r.flat_count < 0, "layout: a cut after a Flat cut (over ", c.over, ") has no region");
    if (c.kind == Cut::Kind::Split) {
      const size_t d = size_t(c.dim);
      r.length[d] /= c.degree;
      r.offset[d] += coords[i] * r.length[d];
    } else {
      int64_t numel = 1;
      for (int64_t n : r.length) numel *= n;
      const int64_t chunk = (numel + c.degree - 1) / c.degree;
      r.flat_start = coords[i] * chunk, r.flat_count = chunk;
    }
  }
  return r;
}

TensorRegion local_region(const Layout& layout, const Mesh& mesh) {
  std::vector<int> coords;
  for (const Cut& c : layout.cuts) coords.push_back(mesh.coord(c.over));
  return part_region(layout, coords);
}

at::Tensor join_parts(const Layout& layout, const std::vector<at::Tensor>& parts) {
  // Undo the cuts from the last: the parts differing only in the last coordinate are joined
  // first, and so on up to the whole tensor.
  std::vector<at::Tensor> level = parts;
  for (size_t i = layout.cuts.size(); i-- > 0;) {
    const Cut& c = layout.cuts[i];
    const std::vector<int64_t> before = layout.shape_after(i);
    VIDIT_CHECK(level.size() % size_t(c.degree) == 0, "layout: ", level.size(), " parts cannot be cut ", c.degree,
                " ways over ", c.over);
    std::vector<at::Tensor> next;
    for (size_t j = 0; j < level.size(); j += size_t(c.degree)) {
      std::vector<at::Tensor> group(level.begin() + j, level.begin() + j + c.degree);
      if (c.kind == Cut::Kind::Split) {
        next.push_back(at::cat(group, c.dim));
      } else {
        for (auto& g : group) g = g.reshape(-1);
        at::Tensor flat = at::cat(group);
        int64_t numel = 1;
        for (int64_t d : before) numel *= d;
        VIDIT_CHECK(flat.numel() >= numel, "layout: the parts over ", c.over, " hold ", flat.numel(),
                    " values, fewer than the ", numel, " of shape ", c10::IntArrayRef(before));
        next.push_back(flat.narrow(0, 0, numel).reshape(before));
      }
    }
    level = std::move(next);
  }
  VIDIT_CHECK(level.size() == 1, "layout: ", parts.size(), " parts for one tensor");
  return level[0].contiguous();
}

at::Tensor gather_whole(const Layout& layout, const at::Tensor& local, const Mesh& mesh) {
  at::NoGradGuard no_grad;
  if (layout.cuts.empty()) return local.detach().clone();
  at::Tensor t = local.detach().contiguous();
  for (size_t i = layout.cuts.size(); i-- > 0;) {
    const Cut& c = layout.cuts[i];
    const auto& group = mesh.group(c.over);
    const std::vector<int64_t> before = layout.shape_after(i);
    if (c.kind == Cut::Kind::Split) {
      // The gather concatenates along dim 0: move the split dim there and back.
      at::Tensor in = t.transpose(0, c.dim).contiguous();
      std::vector<int64_t> shape = in.sizes().vec();
      shape[0] *= c.degree;
      at::Tensor all = at::empty(shape, in.options());
      group->all_gather(in, all)->wait();
      t = all.transpose(0, c.dim).contiguous();
    } else {
      at::Tensor in = t.reshape(-1), all = at::empty({c.degree * in.numel()}, in.options());
      group->all_gather(in, all)->wait();
      int64_t numel = 1;
      for (int64_t d : before) numel *= d;
      t = all.narrow(0, 0, numel).reshape(before).clone();
    }
  }
  return t;
}

std::string model_part(const std::string& name) {
  const size_t dot = name.find('.');
  if (dot != std::string::npos && name.compare(0, dot, "blocks") == 0) return name.substr(0, name.find('.', dot + 1));
  return name.substr(0, dot);
}

namespace {
// The reduced sums of squares, one per (part, cut groups), on the CPU, with each entry's part.
std::pair<std::vector<std::string>, at::Tensor> reduced_squares(
    const TensorMap& tensors, const Layouts& layouts, const Mesh& mesh,
    const std::function<std::string(const std::string&)>& part_of) {
  at::NoGradGuard no_grad;
  // Tensors grouped by (part, the set of groups they are cut over); each group's squares summed
  // locally. The keys come from the names, not from which tensors are defined, so that every
  // rank issues the same collectives.
  using Key = std::pair<std::string, std::set<std::string>>;
  std::map<Key, std::vector<at::Tensor>> by_cut;
  at::Device device = at::kCPU;
  for (const auto& [name, t] : tensors) {
    std::set<std::string> groups;
    auto it = layouts.find(name);
    if (it != layouts.end())
      for (const Cut& c : it->second.cuts) groups.insert(c.over);
    std::vector<at::Tensor>& ts = by_cut[{part_of(name), groups}];
    if (t.defined()) ts.push_back(t), device = t.device();
  }
  std::vector<std::string> parts;
  if (by_cut.empty()) return {parts, at::zeros({1}, at::kDouble)};
  std::vector<at::Tensor> sums;
  for (auto& [key, ts] : by_cut)
    sums.push_back(ts.empty() ? at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device))
                              : at::stack(at::_foreach_norm(ts, 2)).to(at::kDouble).square().sum().to(device));
  at::Tensor sq = at::stack(sums);
  // Over each group some key is cut over, the entries cut over it are summed (the same order on
  // every rank: the names, hence the keys, are the same everywhere).
  std::set<std::string> every;
  for (const auto& [key, ts] : by_cut) every.insert(key.second.begin(), key.second.end());
  for (const std::string& g : every) {
    std::vector<int64_t> idx;
    int64_t k = 0;
    for (const auto& [key, ts] : by_cut) {
      if (key.second.count(g)) idx.push_back(k);
      ++k;
    }
    at::Tensor where = at::tensor(idx, at::kLong).to(sq.device());
    at::Tensor part = sq.index_select(0, where);
    mesh.group(g)->all_reduce(part, ReduceOp::Sum)->wait();
    sq.index_copy_(0, where, part);
  }
  for (const auto& [key, ts] : by_cut) parts.push_back(key.first);
  return {parts, sq.cpu()};
}
}  // namespace

std::map<std::string, double> global_norms_by_part(const TensorMap& tensors, const Layouts& layouts, const Mesh& mesh,
                                                   const std::function<std::string(const std::string&)>& part_of) {
  auto [parts, sq] = reduced_squares(tensors, layouts, mesh, part_of);
  std::map<std::string, double> out;
  const double* v = sq.data_ptr<double>();
  for (size_t k = 0; k < parts.size(); ++k) out[parts[k]] += v[k];
  for (auto& [part, x] : out) x = std::sqrt(x);
  return out;
}

double global_norm(const TensorMap& tensors, const Layouts& layouts, const Mesh& mesh) {
  return std::sqrt(reduced_squares(tensors, layouts, mesh, [](const std::string&) { return std::string(); })
                       .second.sum()
                       .item<double>());
}

}  // namespace vidit

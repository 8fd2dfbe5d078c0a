// Spatial tiling: runs a function on overlapping tiles of a frame grid and blends the results
// linearly where tiles overlap, so that large frames fit in memory. Used by the VAE for encode
// (tiles of pixels -> tiles of latents, scale 1/8) and decode (latents -> pixels, scale 8).
//
// Along each of H and W, tiles of `tile` input pixels start every `stride` pixels until one
// reaches the end (the last may be shorter). Output pixel weights ramp linearly across each
// overlap (tile - stride input pixels, times the scale in output pixels): from the previous tile
// to the next, (y+1)/(e+1) and its complement for an overlap of e output pixels; the output is
// sum(w * tile) / sum(w), so weights always add to one. The blend hides seams; it does not make a
// tiled run equal an untiled one when the function sees further than the overlap (the VAE does).
//
// blend_tiles_as_diffusers() is diffusers' AutoencoderKLWan tiling instead, for the Wan 2.2 VAE,
// whose results are compared with diffusers': tiles start every stride until past the end (not
// until one reaches it), each tile's output is blended into the one above and the one to the left
// over a fixed extent (b = a * (1 - y/e) + b * y/e, in raster order, each blend seeing the earlier
// ones), and only its first out_stride rows and columns are kept.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace vidit {

struct TileSpan {
  int64_t begin, end;  // [begin, end) along one axis, input pixels
};

// Tile spans along an axis of `size` pixels. Requires 0 < stride <= tile.
std::vector<TileSpan> tile_spans(int64_t size, int64_t tile, int64_t stride);

// Tiles shared among processes (a sampling job's ranks, pipeline/sampling_ranks.h): tile k (row
// major) is computed by process k % count only; every process first computes its own tiles, then
// for each tile in order calls share(k, owner, output) (the owner passes its output, the others an
// undefined tensor) and blends what it returns. Every process must call tiled_apply together and
// get every tile's output back from share; the blend is then the same, in the same order, as one
// process's.
struct TileShare {
  int index = 0, count = 1;
  std::function<at::Tensor(size_t tile, int owner, const at::Tensor& output)> share;
};

// Applies `fn` to x[..., h-tile, w-tile] for every tile of the last two dims of x and blends the
// outputs (with `share`: the tiles split among processes as above). fn maps an input tile of (h, w) pixels to an output of (h * num / den, w * num / den)
// pixels on its last two dims with the same leading dims for every tile (checked). Every tile
// start and end times num/den must be an integer (checked). Throws vidit::Error otherwise.
at::Tensor tiled_apply(const at::Tensor& x, int64_t tile, int64_t stride, int64_t num, int64_t den,
                       const std::function<at::Tensor(const at::Tensor&)>& fn, const TileShare* share = nullptr);

// diffusers' tiling (above): fn on x[..., i:i+tile, j:j+tile] for i, j = 0, stride, ... below the
// last two dims' sizes; outputs blended over `blend` output pixels and cut to out_stride each;
// the whole cut to out_h x out_w. Throws vidit::Error when the tiles' outputs differ in their
// leading dims.
at::Tensor blend_tiles_as_diffusers(const at::Tensor& x, int64_t tile, int64_t stride, int64_t out_stride, int64_t blend,
                                    int64_t out_h, int64_t out_w, const std::function<at::Tensor(const at::Tensor&)>& fn);

}  // namespace vidit

// A set of named tensors read one at a time: every name's whole shape and dtype known up front,
// each tensor produced only when asked for. What lets a writer lay out a file (a safetensors
// header, shards of at most so many bytes) before any tensor exists, then hold one tensor at a
// time: `vidit export` of a model larger than the host's memory (train/run_weights.h).
//
// Contract of `read`: read(key) is called only with keys of `info`, any number of times, in any
// order, on the thread that owns the stream; it returns a tensor of info's shape and dtype (any
// device, any strides) that the caller may keep but must not modify: it may be shared (a map's
// own tensor) or a view of a memory-mapped file. A stream is copied cheaply; its copies share
// what `read` captures.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/safetensors.h"

namespace vidit {

struct TensorInfo {
  std::vector<int64_t> shape;        // the whole tensor's
  at::ScalarType dtype = at::kFloat;
  int64_t numel() const;
  uint64_t bytes() const;            // numel * the dtype's size
  static TensorInfo of(const at::Tensor& t);  // t's shape and dtype (t defined)
};

struct TensorStream {
  std::map<std::string, TensorInfo> info;  // every tensor, in key order
  std::function<at::Tensor(const std::string& key)> read;

  // read(key), checked: throws vidit::Error naming the key when it is not in `info`, or when
  // what `read` produced is undefined or not of the announced shape and dtype.
  at::Tensor get(const std::string& key) const;
  // Every tensor's bytes added up.
  uint64_t bytes() const;
};

// `tensors` as a stream (it keeps them: shared, not copied). Each must be defined.
TensorStream stream_of(TensorMap tensors);
// The stream's shapes and dtypes as tensors on the meta device (no memory), for the checks that
// take a TensorMap (check_state_dict).
TensorMap meta_tensors(const TensorStream& stream);
// Every tensor read at once: the whole set in memory (what a stream avoids; for callers that
// need a map).
TensorMap read_all(const TensorStream& stream);

}  // namespace vidit

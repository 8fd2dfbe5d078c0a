// Tensors read one at a time (see tensor_stream.h).
#include "core/tensor_stream.h"

#include <memory>

#include "core/error.h"

namespace vidit {

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t TensorInfo::bytes() const { return uint64_t(numel()) * c10::elementSize(dtype); }

TensorInfo TensorInfo::of(const at::Tensor& t) { return {t.sizes().vec(), t.scalar_type()}; }

at::Tensor TensorStream::get(const std::string& key) const {
  auto it = info.find(key);
  VIDIT_CHECK(it != info.end(), "tensor stream: '", key, "' is not one of its ", info.size(), " tensors");
  at::Tensor t = read(key);
  VIDIT_CHECK(t.defined(), "tensor stream: reading '", key, "' gave no tensor");
  VIDIT_CHECK(t.sizes().equals(it->second.shape) && t.scalar_type() == it->second.dtype, "tensor stream: '", key,
              "' was announced as ", c10::toString(it->second.dtype), " ", c10::IntArrayRef(it->second.shape),
              " but read as ", c10::toString(t.scalar_type()), " ", t.sizes(),
              " (its source changed while it was read?)");
  return t;
}

uint64_t TensorStream::bytes() const {
  uint64_t n = 0;
  for (const auto& [key, i] : info) n += i.bytes();
  return n;
}

TensorStream stream_of(TensorMap tensors) {
  TensorStream s;
  for (const auto& [key, t] : tensors) {
    VIDIT_CHECK(t.defined(), "tensor stream: tensor '", key, "' is undefined");
    s.info.emplace(key, TensorInfo::of(t));
  }
  auto held = std::make_shared<const TensorMap>(std::move(tensors));
  s.read = [held](const std::string& key) { return held->at(key); };
  return s;
}

TensorMap meta_tensors(const TensorStream& stream) {
  TensorMap out;
  for (const auto& [key, i] : stream.info)
    out.emplace(key, at::empty(i.shape, at::TensorOptions().dtype(i.dtype).device(at::kMeta)));
  return out;
}

TensorMap read_all(const TensorStream& stream) {
  TensorMap out;
  for (const auto& [key, i] : stream.info) out.emplace(key, stream.get(key));
  return out;
}

}  // namespace vidit

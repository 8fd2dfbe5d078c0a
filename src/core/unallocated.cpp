#include "core/unallocated.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>

namespace vidit {

at::Tensor unallocated(at::IntArrayRef shape, const at::TensorOptions& options) {
  // An empty tensor of the device (its storage knows the device's allocator), then the shape
  // without the storage to match: what release() leaves behind.
  at::Tensor t = at::empty({0}, options);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  return t;
}

bool is_unallocated(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 && t.storage().nbytes() == 0;
}

void allocate(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t bytes = size_t(t.numel()) * t.element_size();
  if (s->nbytes() == bytes) return;
  const c10::OptionalDeviceGuard on(t.device());  // the allocator allocates on the current device
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

void release(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

}  // namespace vidit

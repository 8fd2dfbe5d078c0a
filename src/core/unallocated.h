// Tensors that have a shape, a dtype and a device but no memory yet: how a model larger than one
// rank is described before it is cut ("build, parallelize, then allocate").
//
// An unallocated tensor is an ordinary dense tensor of its device (CPU or CUDA dispatch, so
// modules, autograd and set_data treat it as any parameter) whose storage holds zero bytes and
// no pointer. Its sizes, dtype and device may be read; its values may not: an op that reads or
// views it fails (c10 checks the storage's size), so a forgotten allocation is an error, never
// garbage. allocate() gives the storage its bytes in place (the tensor object, its autograd
// identity and every module member that refers to it stay the same), release() takes them back
// (FSDP frees gathered weights this way between uses).
#pragma once
#include <ATen/ATen.h>

namespace vidit {

// A contiguous tensor of `shape` with `options` (dtype, device) and no memory. Never allocates.
at::Tensor unallocated(at::IntArrayRef shape, const at::TensorOptions& options);

// Whether `t` has a shape with elements but its storage holds no memory (unallocated, or
// released).
bool is_unallocated(const at::Tensor& t);

// Gives t's storage memory for all its elements from its device's allocator, in place, when it
// has none; the values are undefined. `t` must own its storage (contiguous, offset 0).
void allocate(const at::Tensor& t);

// Frees t's memory in place; the tensor keeps its shape and identity (unallocated again).
void release(const at::Tensor& t);

}  // namespace vidit

// Keeps freed host memory in the process instead of returning it to the kernel.
// glibc serves every allocation above its mmap threshold (128 KiB at start) with a fresh mmap
// and unmaps it on free, so a training step that allocates the same activation sizes every
// step page-faults (and zero-fills) all of them again each time: at the demo model's size that
// was a quarter of the CPU step. Raising the mmap threshold to its maximum (32 MiB) and the trim
// threshold to 1 GiB makes those blocks come from, and go back to, the heap. Call once, first
// thing in main(); it changes nothing where the C library is not glibc.
#pragma once

namespace vidit {

// Returns false when the C library refused the settings (then allocation behaves as before).
bool keep_freed_memory();

// For a phase that allocates many large tensors once, some kept and some freed between them (a
// resume: each whole tensor read, this rank's part cut from it and kept, the whole freed): while
// alive, blocks of at least 128 KiB get their own mapping again and go back to the kernel when
// freed, instead of leaving holes in the heap between the kept ones that the heap keeps resident
// (measured: 1.9 GB of free heap held by each of 4 ranks after a resume of the 0.28 B model, its
// peak 22% over the plan). On destruction the settings of keep_freed_memory() return when they
// were in force, and the heap's free pages are given back. Nothing where the C library is not glibc.
class ScopedFreshMappings {
 public:
  ScopedFreshMappings();
  ~ScopedFreshMappings();
  ScopedFreshMappings(const ScopedFreshMappings&) = delete;
  ScopedFreshMappings& operator=(const ScopedFreshMappings&) = delete;

 private:
  bool restore_ = false;
};

}  // namespace vidit

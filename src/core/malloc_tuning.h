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

}  // namespace vidit

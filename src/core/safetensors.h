// safetensors files: an 8-byte little-endian header length N, N bytes of JSON describing each
// tensor (dtype, shape, data_offsets into the byte buffer that follows), then the raw bytes.
// Readable by every Python tool; no pickle. Writes are atomic (temporary file, fsync, rename).
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>

namespace vidit {

using TensorMap = std::map<std::string, at::Tensor>;

// Writes `tensors` (any device; copied to CPU, made contiguous) and optional string metadata
// to `path` atomically. Throws vidit::Error with the path on any I/O failure.
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

class WritableFile;
// Streams `tensors` (any device; copied to CPU one at a time when not there) as one safetensors
// file into `file` (no fsync, no close: the caller's), the tensors' bytes in key order from the
// returned offset. Used by the checkpoint writer.
uint64_t write_safetensors(WritableFile& file, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata = {});

struct TensorStream;  // core/tensor_stream.h
// The same from a stream: the header from its shapes and dtypes, then each tensor read, appended
// and dropped, so that no more than one of them is held at a time. The file is byte for byte the
// one the TensorMap versions write for the same tensors. What a read throws goes through, and a
// tensor read that is not of its announced shape and dtype is a vidit::Error naming its key; the
// file is then incomplete (save_safetensors leaves none behind).
uint64_t write_safetensors(WritableFile& file, const TensorStream& tensors,
                           const std::map<std::string, std::string>& metadata = {});
void save_safetensors(const std::string& path, const TensorStream& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of `path` into owned CPU tensors. Throws vidit::Error naming the file and
// the offending tensor on a malformed header, unknown dtype, bad offsets or a truncated file.
TensorMap load_safetensors(const std::string& path,
                           std::map<std::string, std::string>* metadata = nullptr);
// Same, from bytes in memory (`name` is used in messages). Used by the fuzz-style tests.
TensorMap parse_safetensors(const uint8_t* data, size_t size, const std::string& name,
                            std::map<std::string, std::string>* metadata = nullptr);

// Same checks, but the tensors are non-owning views into `data` (no copy): for memory-mapped
// files. The caller keeps `data` alive and unmodified while the tensors are in use.
TensorMap view_safetensors(const uint8_t* data, size_t size, const std::string& name);

class MappedFile;
// The tensors of the file at `path`, memory-mapped (core/mapped_file.h): views that keep the
// mapping alive, so that only the bytes a reader touches are read (e.g. one rank's part of each
// weight). With `file`, also the mapping itself (to ask how much of it was read). Throws as
// load_safetensors does; a file that cannot be mapped is named.
TensorMap map_safetensors(const std::string& path, std::shared_ptr<const MappedFile>* file = nullptr);

// Writes `bytes` to `path` atomically: `path.tmp`, fsync, rename, fsync of the directory.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace vidit

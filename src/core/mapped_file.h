// A whole file mapped read-only into memory (unmapped on destruction). Pages are read on first
// touch and belong to the page cache, so processes on one node that map the same file share
// them, and a reader that touches part of a file reads only that part.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace vidit {

class MappedFile {
 public:
  // `what` names the file's role in messages ("cache shard", "checkpoint part"); `fix` says what
  // to do when it cannot be opened. Throws SystemError (core/error.h, with errno) naming the file
  // when the system refuses to open or map it, vidit::Error when it is empty.
  MappedFile(const std::string& path, const std::string& what, const std::string& fix = "");
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Bytes of this mapping that this process has touched so far (its resident pages: the Rss of
  // the mapping in /proc/self/smaps, where the kernel may have mapped a few neighbouring pages
  // with each fault); -1 where the system does not say.
  int64_t resident_bytes() const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Drops this process's resident pages of [data, data + bytes) inside a read-only file mapping
// (madvise DONTNEED, widened to whole pages): the page cache keeps them and touching them again
// faults them back in, but they stop counting in this process's resident set. What a reader does
// once it has copied a tensor out of a mapped file, so that reading a large file a tensor at a
// time never holds the whole file resident.
void release_mapped_pages(const void* data, size_t bytes);

}  // namespace vidit

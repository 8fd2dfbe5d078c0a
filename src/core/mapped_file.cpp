#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace vidit {

MappedFile::MappedFile(const std::string& path, const std::string& what, const std::string& fix) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_system(errno, what, " '", path, "' cannot be opened: ", std::strerror(errno), fix.empty() ? "" : "; ", fix);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail_system(err, what, " '", path, "' cannot be read: ", std::strerror(err));
  }
  size_ = size_t(st.st_size);
  void* p = size_ ? ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED && size_ == 0) fail(what, " '", path, "' is empty", fix.empty() ? "" : "; ", fix);
  if (p == MAP_FAILED)
    fail_system(err, what, " '", path, "' cannot be mapped (", size_, " bytes): ", std::strerror(err),
                fix.empty() ? "" : "; ", fix);
  data_ = static_cast<const uint8_t*>(p);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

int64_t MappedFile::resident_bytes() const {
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps) return -1;
  const auto start = reinterpret_cast<uintptr_t>(data_);
  bool ours = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long lo = 0, hi = 0;
    // A mapping's first line: "lo-hi perms offset dev inode path"; its fields follow.
    // (Field lines, "Rss:   12 kB", never parse as two hex numbers joined by '-'.)
    if (std::sscanf(line.c_str(), "%llx-%llx", &lo, &hi) == 2) {
      ours = lo == start;
      continue;
    }
    if (ours && line.rfind("Rss:", 0) == 0) {
      std::istringstream fields(line.substr(4));
      int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return -1;
}

void release_mapped_pages(const void* data, size_t bytes) {
  if (bytes == 0) return;
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes + page - 1) / page * page;
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);  // advice: a failure changes nothing
}

}  // namespace vidit

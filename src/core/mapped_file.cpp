#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

}  // namespace vidit

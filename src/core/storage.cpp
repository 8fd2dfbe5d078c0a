#include "core/storage.h"

#include <fcntl.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/mapped_file.h"

namespace vidit {
namespace fs = std::filesystem;

namespace {

class PosixFile : public WritableFile {
 public:
  explicit PosixFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    VIDIT_CHECK(fd_ >= 0, "cannot create '", path, "': ", std::strerror(errno));
  }
  ~PosixFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  void append(const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      VIDIT_CHECK(w > 0, "write to '", path_, "' failed: ", std::strerror(errno),
                  errno == ENOSPC ? " (the disk is full: free space or point train.out_dir elsewhere)" : "");
      p += w;
      n -= size_t(w);
      written_ += uint64_t(w);
    }
#ifdef __linux__
    // Start the disk's writeback of every full 32 MiB as it is appended, so that the device
    // writes while the next bytes are copied, and the final fsync waits for the tail only.
    constexpr uint64_t kFlush = 32ull << 20;
    while (written_ - flushed_ >= kFlush) {
      ::sync_file_range(fd_, off64_t(flushed_), off64_t(kFlush), SYNC_FILE_RANGE_WRITE);
      flushed_ += kFlush;
    }
#endif
  }
  void sync() override {
    VIDIT_CHECK(::fsync(fd_) == 0, "fsync of '", path_, "' failed: ", std::strerror(errno));
  }
  void close() override {
    const int fd = fd_;
    fd_ = -1;
    VIDIT_CHECK(::close(fd) == 0, "closing '", path_, "' failed: ", std::strerror(errno));
  }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0, flushed_ = 0;
};

class PosixReadable : public ReadableFile {
 public:
  explicit PosixReadable(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail_system(errno, "'", path, "' cannot be opened: ", std::strerror(errno));
  }
  ~PosixReadable() override { ::close(fd_); }
  size_t read_at(uint64_t offset, void* out, size_t bytes) override {
    char* p = static_cast<char*>(out);
    size_t got = 0;
    while (got < bytes) {
      const ssize_t n = ::pread(fd_, p + got, bytes - got, off_t(offset + got));
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        fail_system(errno, "'", path_, "' cannot be read at byte ", offset + got, ": ", std::strerror(errno));
      }
      got += size_t(n);
    }
    return got;
  }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

class LocalStorage : public Storage {
 public:
  std::unique_ptr<WritableFile> create(const std::string& path) override { return std::make_unique<PosixFile>(path); }
  void rename(const std::string& from, const std::string& to) override {
    VIDIT_CHECK(::rename(from.c_str(), to.c_str()) == 0, "rename '", from, "' -> '", to,
                "' failed: ", std::strerror(errno));
  }
  void remove_all(const std::string& path) override {
    std::error_code ec;
    fs::remove_all(path, ec);
    VIDIT_CHECK(!ec, "cannot remove '", path, "': ", ec.message());
  }
  void create_dirs(const std::string& path) override {
    std::error_code ec;
    fs::create_directories(path, ec);
    VIDIT_CHECK(!ec, "cannot create the directory '", path, "': ", ec.message());
  }
  void sync_dir(const std::string& path) override {
    const int fd = ::open(path.empty() ? "." : path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;  // nothing to make durable
    ::fsync(fd);
    ::close(fd);
  }
  std::unique_ptr<MappedFile> map(const std::string& path, const std::string& what) override {
    return std::make_unique<MappedFile>(path, what);
  }
  std::string read(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail_system(errno, "'", path, "' cannot be opened: ", std::strerror(errno));
    std::string out;
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        ::close(fd);
        fail_system(err, "'", path, "' cannot be read: ", std::strerror(err));
      }
      out.append(buf, size_t(n));
    }
    ::close(fd);
    return out;
  }
  std::unique_ptr<ReadableFile> open(const std::string& path) override { return std::make_unique<PosixReadable>(path); }
  bool exists(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
  }
  std::vector<std::string> list(const std::string& dir) override {
    std::vector<std::string> out;
    std::error_code ec;
    fs::directory_iterator it(dir, ec);
    if (ec == std::errc::no_such_file_or_directory) return out;
    VIDIT_CHECK(!ec, "cannot list the directory '", dir, "': ", ec.message());
    for (const auto& e : it) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  uint64_t size(const std::string& path) override {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) fail_system(errno, "'", path, "' cannot be read: ", std::strerror(errno));
    return uint64_t(st.st_size);
  }
};

}  // namespace

void Storage::write_atomic(const std::string& path, const std::string& bytes) {
  write_atomic(path, [&](WritableFile& f) { f.append(bytes.data(), bytes.size()); });
}

void Storage::write_atomic(const std::string& path, const std::function<void(WritableFile&)>& write) {
  const std::string tmp = path + ".tmp";
  {
    std::unique_ptr<WritableFile> f = create(tmp);
    try {
      write(*f);
      f->sync();
      f->close();
    } catch (...) {
      f.reset();
      try {
        remove_all(tmp);
      } catch (const std::exception&) {
        // (the write's own failure is the one to report)
      }
      throw;
    }
  }
  rename(tmp, path);
  sync_dir(fs::path(path).parent_path().string());
}

Storage& local_storage() {
  static LocalStorage storage;
  return storage;
}

}  // namespace vidit

// Storage: the few file-system operations a checkpoint save and load need (create and append to
// a file, fsync it, rename, remove, make directories; map a file, read a small one, read any
// range of one; whether a path exists, a directory's names, a file's size), behind one small interface, so that a wrapper
// can stand between the writer and the disk. ForwardingStorage passes every call on to another
// Storage; a wrapper derives from it and changes only what it needs. The fault injection's
// failing and slow storage is one (resilience/faulty_storage.h); a remote object store would be
// another. Every failure throws vidit::Error naming the path and the system's reason; those of
// the reading calls are SystemError (core/error.h), carrying errno.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"

namespace vidit {

// A file open for writing, from its start. Destroying it without close() closes it.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual void append(const void* data, size_t bytes) = 0;
  virtual void sync() = 0;   // fsync: the bytes appended so far are on the device
  virtual void close() = 0;
  virtual const std::string& path() const = 0;
};

// A file open for reading at any offset. Destroying it closes it.
class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  // Up to `bytes` bytes from `offset` into `out`: fewer only at the end of the file (0 past it).
  // Throws SystemError on a failure.
  virtual size_t read_at(uint64_t offset, void* out, size_t bytes) = 0;
  virtual const std::string& path() const = 0;
};

class Storage {
 public:
  virtual ~Storage() = default;
  // Creates (or truncates) `path` for writing.
  virtual std::unique_ptr<WritableFile> create(const std::string& path) = 0;
  virtual void rename(const std::string& from, const std::string& to) = 0;
  virtual void remove_all(const std::string& path) = 0;
  virtual void create_dirs(const std::string& path) = 0;
  // fsync of a directory, so that the names created or renamed in it are durable.
  virtual void sync_dir(const std::string& path) = 0;
  // Reading: the whole file mapped read-only (`what` names its role in messages), and a small
  // file's bytes. Throw SystemError (ENOENT for a file that is not there).
  virtual std::unique_ptr<MappedFile> map(const std::string& path, const std::string& what) = 0;
  virtual std::string read(const std::string& path) = 0;
  // `path` for reads at any offset (a writer's read-back of what it wrote, streamed through a
  // buffer). SystemError, ENOENT when it is not there.
  virtual std::unique_ptr<ReadableFile> open(const std::string& path) = 0;
  // What is there: whether `path` exists (a file or a directory); the names directly inside the
  // directory `dir`, sorted (none when `dir` is not there); a file's size in bytes (SystemError,
  // ENOENT when it is not there).
  virtual bool exists(const std::string& path) = 0;
  virtual std::vector<std::string> list(const std::string& dir) = 0;
  virtual uint64_t size(const std::string& path) = 0;

  // Writes `bytes` to `path` durably and atomically: `path.tmp`, fsync, rename, fsync of the
  // directory. Either the old content or the new one is found after a crash.
  void write_atomic(const std::string& path, const std::string& bytes);
  // The same for content that `write` appends to the file (streamed, e.g. tensors).
  void write_atomic(const std::string& path, const std::function<void(WritableFile&)>& write);
};

// The local file system (POSIX calls).
Storage& local_storage();

// Passes everything on to `base`; wrappers override what they change.
class ForwardingStorage : public Storage {
 public:
  explicit ForwardingStorage(Storage& base) : base_(base) {}
  std::unique_ptr<WritableFile> create(const std::string& path) override { return base_.create(path); }
  void rename(const std::string& from, const std::string& to) override { base_.rename(from, to); }
  void remove_all(const std::string& path) override { base_.remove_all(path); }
  void create_dirs(const std::string& path) override { base_.create_dirs(path); }
  void sync_dir(const std::string& path) override { base_.sync_dir(path); }
  std::unique_ptr<MappedFile> map(const std::string& path, const std::string& what) override {
    return base_.map(path, what);
  }
  std::string read(const std::string& path) override { return base_.read(path); }
  std::unique_ptr<ReadableFile> open(const std::string& path) override { return base_.open(path); }
  bool exists(const std::string& path) override { return base_.exists(path); }
  std::vector<std::string> list(const std::string& dir) override { return base_.list(dir); }
  uint64_t size(const std::string& path) override { return base_.size(path); }

 protected:
  Storage& base() { return base_; }

 private:
  Storage& base_;
};

}  // namespace vidit

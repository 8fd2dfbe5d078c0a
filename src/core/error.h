// Errors: one exception type for everything a user can fix (bad config, bad file, bad
// checkpoint). The message always names the file / key / sample and says what to do.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace vidit {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A failure the operating system reported (open, fstat, mmap, read), with its errno, so that a
// caller can tell a file it could not read (EIO, EACCES, ENOMEM: perhaps passing) from one whose
// content is wrong.
class SystemError : public Error {
 public:
  SystemError(const std::string& what, int code) : Error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  append(os, rest...);
}
}  // namespace detail

// Builds a message from any streamable parts: fail("key '", k, "' must be > 0").
template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream os;
  detail::append(os, parts...);
  throw Error(os.str());
}

// fail() for an operating system's error `code` (errno): throws SystemError.
template <typename... Parts>
[[noreturn]] void fail_system(int code, const Parts&... parts) {
  std::ostringstream os;
  detail::append(os, parts...);
  throw SystemError(os.str(), code);
}

#define VIDIT_CHECK(cond, ...)            \
  do {                                    \
    if (!(cond)) ::vidit::fail(__VA_ARGS__); \
  } while (0)

}  // namespace vidit

#include "prepare/webdataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "core/error.h"

namespace vidit {
namespace {

// ---------------------------------------------------------------------------------------------
// Brace expansion.

constexpr size_t kMaxShardNames = 10'000'000;

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Parses the recursive grammar  sequence := (literal | '{' group '}')*,
// group := range | sequence (',' sequence)+ , expanding as it goes.
class BraceExpander {
 public:
  explicit BraceExpander(const std::string& pattern) : p_(pattern) {}

  std::vector<std::string> run() {
    size_t i = 0;
    std::vector<std::string> out = sequence(i, /*nested=*/false);
    return out;
  }

 private:
  [[noreturn]] void bad(const std::string& why) const {
    fail("shard pattern '", p_, "': ", why,
         "; write ranges as {00000..00099} (ascending, digits only) and lists as {a,b,c}");
  }

  // Reads literals and groups from `i` until the end (top level) or an unnested ',' / '}' (inside
  // a group, left for the caller).
  std::vector<std::string> sequence(size_t& i, bool nested) {
    std::vector<std::string> out = {""};
    while (i < p_.size()) {
      const char c = p_[i];
      if (c == '{') {
        std::vector<std::string> group = this->group(i);
        out = product(out, group);
      } else if (c == '}' || (c == ',' && nested)) {
        if (!nested) bad("'}' at column " + std::to_string(i + 1) + " closes no '{'");
        return out;
      } else {
        for (auto& s : out) s += c;
        ++i;
      }
    }
    return out;
  }

  // The group whose '{' is at `i`; leaves `i` after its '}'.
  std::vector<std::string> group(size_t& i) {
    const size_t open = i;
    size_t close = open + 1;
    bool nested_or_list = false;
    for (int depth = 1; close < p_.size(); ++close) {
      if (p_[close] == '{') ++depth, nested_or_list = true;
      if (p_[close] == ',') nested_or_list = true;
      if (p_[close] == '}' && --depth == 0) break;
    }
    if (close >= p_.size()) bad("the '{' at column " + std::to_string(open + 1) + " is never closed");
    const std::string content = p_.substr(open + 1, close - open - 1);
    if (!nested_or_list) {
      if (content.find("..") == std::string::npos)
        bad("'{" + content + "}' is neither a range nor a list");
      i = close + 1;
      return range(content);
    }
    i = open + 1;
    std::vector<std::string> out;
    size_t alternatives = 0;
    while (true) {
      std::vector<std::string> alt = sequence(i, /*nested=*/true);
      out.insert(out.end(), alt.begin(), alt.end());
      ++alternatives;
      if (out.size() > kMaxShardNames) bad("it stands for more than ten million names");
      if (p_[i] == '}') break;  // sequence() stopped at ',' or '}' (the group is closed)
      ++i;                      // ','
    }
    ++i;  // '}'
    if (alternatives < 2) bad("'{" + content + "}' is neither a range nor a list");
    return out;
  }

  // `lo..hi` or `lo..hi..step`, digits only, lo <= hi.
  std::vector<std::string> range(const std::string& content) {
    std::vector<std::string> parts;
    for (size_t from = 0;;) {
      const size_t dots = content.find("..", from);
      parts.push_back(content.substr(from, dots == std::string::npos ? std::string::npos : dots - from));
      if (dots == std::string::npos) break;
      from = dots + 2;
    }
    const std::string shown = "'{" + content + "}'";
    if (parts.size() > 3 || !std::all_of(parts.begin(), parts.end(), all_digits))
      bad(shown + " is not a numeric range");
    for (const auto& s : parts)
      if (s.size() > 18) bad(shown + " has a bound too large");
    const uint64_t lo = std::stoull(parts[0]), hi = std::stoull(parts[1]);
    const uint64_t step = parts.size() == 3 ? std::stoull(parts[2]) : 1;
    if (lo > hi) bad(shown + " is descending");
    if (step == 0) bad(shown + " has a step of 0");
    if ((hi - lo) / step + 1 > kMaxShardNames) bad("it stands for more than ten million names");
    // braceexpand pads when a bound is written with a leading zero, to the wider bound's width.
    const bool padded = (parts[0].size() > 1 && parts[0][0] == '0') || (parts[1].size() > 1 && parts[1][0] == '0');
    const size_t width = padded ? std::max(parts[0].size(), parts[1].size()) : 0;
    std::vector<std::string> out;
    for (uint64_t v = lo; v <= hi; v += step) {
      std::string s = std::to_string(v);
      if (s.size() < width) s.insert(0, width - s.size(), '0');
      out.push_back(std::move(s));
      if (hi - v < step) break;
    }
    return out;
  }

  std::vector<std::string> product(const std::vector<std::string>& left, const std::vector<std::string>& right) {
    if (left.size() * right.size() > kMaxShardNames) bad("it stands for more than ten million names");
    std::vector<std::string> out;
    out.reserve(left.size() * right.size());
    for (const auto& l : left)
      for (const auto& r : right) out.push_back(l + r);
    return out;
  }

  const std::string& p_;
};

// ---------------------------------------------------------------------------------------------
// Reading a file at offsets (pread: no shared file position, so no seeking).

class ShardFile {
 public:
  explicit ShardFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail_system(errno, "shard '", path, "' cannot be opened: ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int code = errno;
      ::close(fd_);
      fail_system(code, "shard '", path, "' cannot be read: ", std::strerror(code));
    }
    if (S_ISDIR(st.st_mode)) {
      ::close(fd_);
      fail_system(EISDIR, "shard '", path, "' is a folder, not a tar file; name the .tar files (e.g. '", path,
                  "/{00000..00099}.tar')");
    }
    size_ = int64_t(st.st_size);
  }
  ~ShardFile() { ::close(fd_); }
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  int64_t size() const { return size_; }

  // Reads up to `n` bytes at `offset` into `buf`; returns how many there were (fewer only at the
  // end of the file). Throws vidit::SystemError when the operating system fails the read.
  int64_t read_at(int64_t offset, int64_t n, char* buf) const {
    int64_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd_, buf + got, size_t(n - got), off_t(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail_system(errno, "shard '", path_, "' cannot be read at byte ", offset + got, ": ", std::strerror(errno));
      if (r == 0) break;
      got += r;
    }
    return got;
  }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Tar headers (POSIX.1-1988 ustar, with the GNU and POSIX.1-2001 pax extensions).

constexpr int64_t kBlock = 512;
constexpr int64_t kMaxMetaBytes = int64_t(16) << 20;  // a GNU long name or pax header larger than this is damage

int64_t round_up(int64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

bool all_zero(const char* p, int64_t n) {
  return std::all_of(p, p + n, [](char c) { return c == 0; });
}

// A NUL-terminated field of at most `n` bytes.
std::string field(const char* p, size_t n) { return std::string(p, strnlen(p, n)); }

// A number field: octal digits (leading spaces allowed, ended by space or NUL; all NUL is 0) or
// GNU's base-256 (first byte 0x80, big-endian). Nullopt when unreadable or negative.
std::optional<int64_t> number(const char* p, size_t n) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  if (u[0] == 0x80) {
    uint64_t v = 0;
    for (size_t i = 1; i < n; ++i) {
      if (v >> 55) return std::nullopt;  // would not fit in int64_t
      v = (v << 8) | u[i];
    }
    return int64_t(v);
  }
  if (u[0] & 0x80) return std::nullopt;  // negative base-256
  size_t i = 0;
  while (i < n && p[i] == ' ') ++i;
  int64_t v = 0;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) v = v * 8 + (p[i] - '0');
  for (; i < n; ++i)
    if (p[i] != ' ' && p[i] != 0) return std::nullopt;
  return v;
}

// The checksum is the sum of the header's bytes with its own field read as spaces; historic
// writers summed signed chars, so both sums are accepted.
bool checksum_ok(const char* h, int64_t* stored, int64_t* computed) {
  const std::optional<int64_t> want = number(h + 148, 8);
  int64_t sum_u = 0, sum_s = 0;
  for (int i = 0; i < kBlock; ++i) {
    const bool in_field = i >= 148 && i < 156;
    sum_u += in_field ? ' ' : static_cast<unsigned char>(h[i]);
    sum_s += in_field ? ' ' : static_cast<signed char>(h[i]);
  }
  *stored = want.value_or(-1);
  *computed = sum_u;
  return want && (*want == sum_u || *want == sum_s);
}

std::string checksum_problem(int64_t stored, int64_t computed) {
  return stored < 0 ? "an unreadable checksum field"
                    : "a bad checksum (stored " + std::to_string(stored) + ", computed " + std::to_string(computed) + ")";
}

std::string after_member(const std::string& last_good) {
  return last_good.empty() ? "before its first member" : "after member '" + last_good + "'";
}

std::string damaged(const std::string& path, const std::string& what) {
  return "shard '" + path + "' is truncated or damaged: " + what +
         "; re-download or re-create the shard (a failed copy or an interrupted writer leaves shards like this)";
}

// Applies the records of a pax extended header ("LEN key=value\n", LEN counting the whole
// record) that matter here. Returns "" or what is wrong with it.
std::string parse_pax(const std::string& data, std::optional<std::string>* path, int64_t* size) {
  size_t i = 0;
  while (i < data.size()) {
    if (data[i] == 0) break;  // NUL padding after the last record
    const size_t space = data.find(' ', i);
    if (space == std::string::npos || !all_digits(data.substr(i, space - i)) || space - i > 12)
      return "a record at byte " + std::to_string(i) + " does not start with its length";
    const size_t len = std::stoull(data.substr(i, space - i));
    if (len <= space - i + 1 || i + len > data.size() || data[i + len - 1] != '\n')
      return "the record at byte " + std::to_string(i) + " has a wrong length";
    const std::string record = data.substr(space + 1, i + len - 1 - space - 1);
    const size_t eq = record.find('=');
    if (eq == std::string::npos) return "the record at byte " + std::to_string(i) + " has no '='";
    const std::string key = record.substr(0, eq), value = record.substr(eq + 1);
    if (key == "path") {
      if (value.empty()) path->reset();  // an empty value deletes the record: the header's name holds
      else *path = value;
    } else if (key == "size") {
      if (!all_digits(value) || value.size() > 18) return "its size record '" + value + "' is not a number";
      *size = int64_t(std::stoll(value));
    }
    i += len;
  }
  return "";
}

// The whole scan, on an open file.
TarScan scan(const ShardFile& file, const std::string& path) {
  TarScan out;
  std::string last_good;
  std::optional<std::string> long_name, pax_path;  // apply to the next header only
  int64_t pax_size = -1;                           // -1: none
  char h[kBlock];
  auto stop = [&](const std::string& what, const std::string& member) {
    out.error = damaged(path, what);
    out.broken_member = member;
    return out;
  };

  for (int64_t pos = 0;;) {
    const int64_t n = file.read_at(pos, kBlock, h);
    if (n == 0)
      return stop("it ends at byte " + std::to_string(file.size()) + ", " + after_member(last_good) +
                      ", without the end-of-archive block",
                  last_good);
    if (all_zero(h, n)) {
      // The end-of-archive block (perhaps itself cut short). Anything but zeros after it means
      // an empty block was written over a header.
      char next[kBlock];
      const int64_t m = n == kBlock ? file.read_at(pos + kBlock, kBlock, next) : 0;
      if (!all_zero(next, m))
        return stop("a zero block at byte " + std::to_string(pos) + ", " + after_member(last_good) +
                        ", is followed by data",
                    last_good);
      return out;
    }
    if (n < kBlock)
      return stop("the header at byte " + std::to_string(pos) + ", " + after_member(last_good) +
                      ", is cut short (the file has " + std::to_string(file.size()) + " bytes)",
                  last_good);
    int64_t stored = 0, computed = 0;
    if (!checksum_ok(h, &stored, &computed))
      return stop("the header at byte " + std::to_string(pos) + ", " + after_member(last_good) +
                      ", has " + checksum_problem(stored, computed),
                  last_good);

    const char type = h[156];
    std::string name = field(h, 100);
    // The ustar prefix; GNU's format ("ustar  ") keeps other fields there.
    if (std::memcmp(h + 257, "ustar\0", 6) == 0 && h[345] != 0) name = field(h + 345, 155) + "/" + name;
    const bool meta = type == 'L' || type == 'K' || type == 'x' || type == 'g';
    if (!meta) {
      if (long_name) name = *long_name;
      if (pax_path) name = *pax_path;
    }
    const std::optional<int64_t> header_size = number(h + 124, 12);
    if (!header_size)
      return stop("the header of '" + name + "' at byte " + std::to_string(pos) + ", " +
                      after_member(last_good) + ", has an unreadable size field",
                  last_good);
    const int64_t size = !meta && pax_size >= 0 ? pax_size : *header_size;
    const int64_t data = pos + kBlock;
    // Entries that carry no data in the archive (links, devices, directories, FIFOs); any other
    // type, known or not, is followed by `size` bytes (as Python's tarfile reads them).
    const bool no_data = type == '1' || type == '2' || type == '3' || type == '4' || type == '5' || type == '6';
    const int64_t length = no_data ? 0 : size;
    if (length > file.size() - data) {
      const std::string what = meta ? "the extended header '" + name + "' " + after_member(last_good)
                                    : "member '" + name + "'";
      return stop(what + " needs bytes " + std::to_string(data) + " to " + std::to_string(data + length) +
                      " but the file has only " + std::to_string(file.size()),
                  meta ? last_good : name);
    }

    if (type == 'L' || type == 'x') {
      if (size > kMaxMetaBytes)
        return stop("the extended header '" + name + "' " + after_member(last_good) + " claims " +
                        std::to_string(size) + " bytes",
                    last_good);
      std::string bytes(size_t(size), '\0');
      file.read_at(data, size, bytes.data());
      if (type == 'L') {
        long_name = std::string(bytes.c_str());
      } else {
        const std::string why = parse_pax(bytes, &pax_path, &pax_size);
        if (!why.empty())
          return stop("the pax header '" + name + "' " + after_member(last_good) + " is malformed: " + why,
                      last_good);
      }
    } else if (!meta) {
      const bool v7_dir = type == '\0' && !name.empty() && name.back() == '/';
      if ((type == '0' || type == '\0' || type == '7') && !v7_dir) {
        out.members.push_back({name, data, size});
        last_good = name;
      }
      long_name.reset();
      pax_path.reset();
      pax_size = -1;
    }
    pos = data + round_up(length);
  }
}

// ---------------------------------------------------------------------------------------------
// Samples.

constexpr const char* kVideoExtensions[] = {"mp4", "webm", "mkv", "mov"};

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// webdataset's split: the key is the path up to the first '.' of its last component.
bool split_key(const std::string& name, std::string* key, std::string* ext) {
  const size_t slash = name.rfind('/');
  const size_t start = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', start);
  if (dot == std::string::npos || dot == start) return false;
  *key = name.substr(0, dot);
  *ext = lower(name.substr(dot + 1));
  return true;
}

bool is_video(const std::string& ext) {
  const size_t dot = ext.rfind('.');
  const std::string last = dot == std::string::npos ? ext : ext.substr(dot + 1);
  return std::any_of(std::begin(kVideoExtensions), std::end(kVideoExtensions),
                     [&](const char* v) { return last == v; });
}

// The offset of the first byte that does not begin a well-formed UTF-8 sequence (overlong
// forms, surrogates and code points above U+10FFFF included), or -1 when `s` is valid.
int64_t invalid_utf8_at(const std::string& s) {
  const auto* u = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = u[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return int64_t(i);
    if (i + len > n) return int64_t(i);
    for (size_t k = 1; k < len; ++k) {
      if ((u[i + k] & 0xC0) != 0x80) return int64_t(i);
      cp = (cp << 6) | (u[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return int64_t(i);
    i += len;
  }
  return -1;
}

std::string trim_trailing(std::string s) {
  const size_t end = s.find_last_not_of(" \t\r\n\f\v");
  s.erase(end == std::string::npos ? 0 : end + 1);
  return s;
}

std::string read_member(const ShardFile& file, const std::string& path, const TarMember& m, int64_t max_bytes) {
  VIDIT_CHECK(m.size <= max_bytes, "member '", m.name, "' of shard '", path, "' is ", m.size,
              " bytes, more than the ", max_bytes, " a text member may have; captions and .json sidecars must be "
              "small text files (is this member really a caption?)");
  VIDIT_CHECK(m.offset >= 0 && m.size >= 0 && m.offset <= file.size() && m.size <= file.size() - m.offset,
              damaged(path, "member '" + m.name + "' needs bytes " + std::to_string(m.offset) + " to " +
                                std::to_string(m.offset + m.size) + " but the file has only " +
                                std::to_string(file.size())));
  std::string bytes(size_t(m.size), '\0');
  const int64_t got = file.read_at(m.offset, m.size, bytes.data());
  VIDIT_CHECK(got == m.size, damaged(path, "member '" + m.name + "' ends early (the file shrank while being read)"));
  return bytes;
}

// The members of one key, as indices into the scan's member list.
struct KeyGroup {
  std::string key;
  std::vector<size_t> members, videos, txts, jsons;
};

// The caption of `g`, or a reason (and the member it is about) it has none.
struct CaptionResult {
  std::string caption, member, reason;
};

CaptionResult caption_of(const KeyGroup& g, const std::vector<TarMember>& members, const ShardFile& file,
                         const std::string& path) {
  const TarMember& video = members[g.videos[0]];
  const bool from_txt = !g.txts.empty();
  const std::vector<size_t>& kind = from_txt ? g.txts : g.jsons;
  if (kind.empty())
    return {"", video.name,
            "video '" + video.name + "' has no caption: add '" + g.key + ".txt' or a '" + g.key +
                ".json' with a string field \"caption\""};
  const TarMember& m = members[kind[0]];
  if (kind.size() > 1)
    return {"", members[kind[1]].name,
            "key '" + g.key + "' has two caption members, '" + m.name + "' and '" + members[kind[1]].name +
                "'; keep one"};
  if (m.size > kMaxTextMemberBytes)
    return {"", m.name,
            "caption member '" + m.name + "' is " + std::to_string(m.size) + " bytes, more than the " +
                std::to_string(kMaxTextMemberBytes) + " a caption may have; is it really a caption?"};
  std::string text;
  try {
    text = read_member(file, path, m, kMaxTextMemberBytes);
  } catch (const SystemError&) {
    throw;
  } catch (const Error& e) {
    return {"", m.name, e.what()};
  }
  const int64_t bad_at = invalid_utf8_at(text);
  if (bad_at >= 0)
    return {"", m.name,
            "caption member '" + m.name + "' is not valid UTF-8 (at byte " + std::to_string(bad_at) +
                "); re-encode it as UTF-8"};
  if (!from_txt) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      return {"", m.name, "caption member '" + m.name + "' is not valid JSON: " + e.what()};
    }
    if (!j.is_object() || !j.contains("caption") || !j["caption"].is_string())
      return {"", m.name,
              "caption member '" + m.name + "' has no string field \"caption\"; add one, or a '" + g.key +
                  ".txt' beside it"};
    text = j["caption"].get<std::string>();
  }
  text = trim_trailing(std::move(text));
  if (text.empty())
    return {"", m.name, "caption member '" + m.name + "' holds an empty caption; write the caption into it"};
  return {text, "", ""};
}

}  // namespace

std::vector<std::string> expand_shard_pattern(const std::string& pattern) { return BraceExpander(pattern).run(); }

TarScan scan_tar(const std::string& path) {
  const ShardFile file(path);
  return scan(file, path);
}

std::vector<TarMember> list_tar_members(const std::string& path) {
  TarScan s = scan_tar(path);
  if (!s.error.empty()) throw Error(s.error);
  return std::move(s.members);
}

std::string read_tar_member(const std::string& path, const TarMember& m, int64_t max_bytes) {
  const ShardFile file(path);
  return read_member(file, path, m, max_bytes);
}

std::vector<WebDatasetSample> read_webdataset_shard(const std::string& path, std::vector<WebDatasetReject>* rejects) {
  const ShardFile file(path);
  const TarScan s = scan(file, path);
  auto reject = [&](const std::string& member, const std::string& reason) {
    if (rejects) rejects->push_back({path, member, reason});
  };

  std::vector<KeyGroup> groups;
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < s.members.size(); ++i) {
    std::string key, ext;
    if (!split_key(s.members[i].name, &key, &ext)) continue;
    const bool video = is_video(ext), txt = ext == "txt", json = ext == "json";
    if (!video && !txt && !json) continue;
    auto [it, added] = index.emplace(key, groups.size());
    if (added) groups.push_back({key, {}, {}, {}, {}});
    KeyGroup& g = groups[it->second];
    g.members.push_back(i);
    (video ? g.videos : txt ? g.txts : g.jsons).push_back(i);
  }

  // When the scan stopped early, the key being read when it broke may have lost members past
  // the damage: a missing video or caption there is the damage's, reported once below.
  std::string cut_key_a, cut_key_b, ext;
  if (!s.error.empty()) {
    if (!s.broken_member.empty()) split_key(s.broken_member, &cut_key_a, &ext);
    if (!s.members.empty()) split_key(s.members.back().name, &cut_key_b, &ext);
  }
  auto covered_by_damage = [&](const std::string& key) {
    return !s.error.empty() && (key == cut_key_a || key == cut_key_b);
  };

  std::vector<WebDatasetSample> out;
  for (const KeyGroup& g : groups) {
    std::string member, reason;
    if (g.videos.empty()) {
      std::string found;
      for (size_t i : g.members) found += (found.empty() ? "" : ", ") + s.members[i].name;
      member = s.members[g.members[0]].name;
      reason = "key '" + g.key + "' has no video member (mp4, webm, mkv or mov); it has: " + found;
    } else if (g.videos.size() > 1) {
      member = s.members[g.videos[1]].name;
      reason = "key '" + g.key + "' has two video members, '" + s.members[g.videos[0]].name + "' and '" + member +
               "'; keep one video per key";
    } else {
      CaptionResult c = caption_of(g, s.members, file, path);
      if (c.reason.empty()) {
        out.push_back({path, g.key, s.members[g.videos[0]], std::move(c.caption)});
        continue;
      }
      member = c.member;
      reason = c.reason;
    }
    const bool incomplete = g.videos.empty() || (g.txts.empty() && g.jsons.empty());
    if (!(incomplete && covered_by_damage(g.key))) reject(member, reason);
  }
  if (!s.error.empty()) reject(s.broken_member, s.error);
  return out;
}

}  // namespace vidit

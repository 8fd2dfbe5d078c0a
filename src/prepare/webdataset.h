// WebDataset shards: POSIX tar files (as video2dataset and webdataset's TarWriter write them)
// whose members are grouped into samples by key: `00001.mp4`, `00001.txt`, `00001.json` are one
// sample with key `00001`.
//
// Three steps, each usable alone:
//   - expand_shard_pattern: the brace patterns users give for shard lists,
//     `shards/{00000..00099}.tar`, expanded as webdataset's braceexpand does;
//   - scan_tar / list_tar_members: the regular-file members of one tar and where their bytes lie,
//     read header by header (nothing is extracted; a member's data is stepped over, not read);
//     ustar, GNU (long names) and pax (path and size records) archives;
//   - read_webdataset_shard: members grouped into samples (one video and its caption per key),
//     with every key that cannot be used returned as a named reject, never thrown, so that one
//     bad sample (or a shard cut short by a failed download) does not stop a million-clip run.
// Video bytes are not read here: a sample names its video member (offset and size in the shard)
// for the decoder; captions are read, checked as UTF-8 and trimmed.
//
// Thread safety: every function is a pure function of its arguments and the files it reads.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace vidit {

// The names a shard pattern stands for, in order. Brace groups expand as braceexpand does:
//   `{00000..00003}`  a numeric range, ascending, inclusive; a bound written with a leading zero
//                     pads every number to the bounds' width (`{000..002}`: 000 001 002);
//   `{a,b,c}`         a list (an alternative may be empty and may hold braces itself);
//   several groups    the cartesian product, the leftmost group varying slowest
//                     (`{a,b}{1,2}`: a1 a2 b1 b2);
//   no brace          the pattern itself.
// Throws vidit::Error naming the pattern for an unmatched brace, an empty group or one that is
// neither a range nor a list (`{abc}`), a descending or non-numeric range, or more than ten
// million names.
std::vector<std::string> expand_shard_pattern(const std::string& pattern);

// One regular file in a tar.
struct TarMember {
  std::string name;     // its full path in the archive (pax path > GNU long name > ustar prefix/name)
  int64_t offset = 0;   // byte offset of its data in the tar file
  int64_t size = 0;     // bytes of data
};

// What a scan of a tar found: every member that lies whole in the file, in archive order, and
// why the scan stopped early if it did.
struct TarScan {
  std::vector<TarMember> members;
  // "" when the archive is whole (its end-of-archive zero block was reached). Otherwise a full
  // message: the shard, the member, that it is truncated or damaged, and to re-download or
  // re-create it.
  std::string error;
  // With an error: the member whose data runs past the end of the file, or, when a header itself
  // is damaged or missing, the last good member before it ("" if there was none).
  std::string broken_member;
};

// Reads the tar at `path` header by header: regular files (typeflag '0', '\0' or '7') are listed;
// directories, links and other entries are skipped; GNU long names ('L') and pax extended headers
// ('x': the `path` and `size` records) apply to the header after them; pax global headers ('g')
// are skipped. Every header's checksum is verified. The archive ends at its first zero block
// (GNU tar writes two; a non-zero block after the first one is damage).
// Damage (a bad checksum or number field, a header or member data past the end of the file, no
// end-of-archive block) is returned in TarScan::error, never thrown. A file that ends on a block
// boundary without the end-of-archive block is damage although GNU tar and Python's tarfile list
// it silently: every writer of shards ends them with it, and a copy cut at a chunk boundary (a
// multiple of 512) leaves no other sign. Throws vidit::SystemError only when the file cannot be
// opened or read (or is a folder).
TarScan scan_tar(const std::string& path);

// scan_tar, throwing TarScan::error as a vidit::Error when the archive is truncated or damaged.
std::vector<TarMember> list_tar_members(const std::string& path);

// The largest member read_tar_member reads by default: captions and JSON sidecars are small.
inline constexpr int64_t kMaxTextMemberBytes = int64_t(16) << 20;

// The bytes of member `m` of the tar at `path` (an entry of list_tar_members(path)). Throws
// vidit::Error naming the shard and member when it is larger than `max_bytes` or the file ends
// before its data does, and vidit::SystemError when the file cannot be read.
std::string read_tar_member(const std::string& path, const TarMember& m,
                            int64_t max_bytes = kMaxTextMemberBytes);

// One training sample of a shard: a video member and its caption.
struct WebDatasetSample {
  std::string shard;     // the tar's path, as given
  std::string key;       // `dir/abc` for members `dir/abc.mp4`, `dir/abc.txt`, ...
  TarMember video;       // the member whose last extension is mp4, webm, mkv or mov (any case)
  std::string caption;   // valid UTF-8, trailing whitespace trimmed, never empty
};

// A key (or a stretch of a shard) that gave no sample, and why.
struct WebDatasetReject {
  std::string shard;     // the tar's path, as given
  std::string member;    // the member the reason is about
  std::string reason;    // names the member(s) and says what to do
};

// The samples of the shard at `path`, in the order their keys first appear in it.
//
// A member's key is its path up to the first '.' of its last path component, the rest is its
// extension (webdataset's rule: `dir/abc.x.mp4` is key `dir/abc`, extension `x.mp4`); members
// whose last component has no '.' (or starts with one) belong to no key. The video is the member
// whose last extension part is mp4 / webm / mkv / mov (case-insensitive). The caption is
// `KEY.txt` (the whole member) or else the string field "caption" of `KEY.json`; other members
// are ignored.
//
// Appended to `*rejects` (when not null), one per key, the rest carrying on: a key with no video,
// a video with no caption (or an empty one), two videos or two captions of one kind under one
// key, a caption that is not valid UTF-8 or over kMaxTextMemberBytes, a .json (when there is no
// .txt) that does not parse or has no string "caption". A truncated or damaged shard gives the
// samples whose members all lay before the damage, plus one reject naming the shard and the
// member where it broke (the key that was being read when it broke is covered by that reject).
// Throws vidit::SystemError only when the file cannot be opened or read.
std::vector<WebDatasetSample> read_webdataset_shard(const std::string& path,
                                                    std::vector<WebDatasetReject>* rejects);

}  // namespace vidit

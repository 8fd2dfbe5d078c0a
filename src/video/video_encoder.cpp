// encode_video_mp4: raw RGB frames piped to the `ffmpeg` program (compiled in every build; it
// needs no FFmpeg libraries, only the CLI on PATH). The child is started with posix_spawnp,
// frames go to its stdin, its stdout goes to /dev/null and its stderr to an unlinked temp file
// whose tail ends up in the error message when the encode fails.
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "video/video_decoder.h"

extern char** environ;

namespace vidit {

namespace {

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

struct SpawnActions {
  posix_spawn_file_actions_t actions;
  bool ok = false;
  SpawnActions() { ok = posix_spawn_file_actions_init(&actions) == 0; }
  ~SpawnActions() {
    if (ok) posix_spawn_file_actions_destroy(&actions);
  }
};

// Blocks SIGPIPE in this thread while writing to the pipe, so a dying ffmpeg turns into an
// EPIPE write error instead of killing the process; a SIGPIPE raised meanwhile is discarded.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_set_);
    sigaddset(&pipe_set_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe_set_, &old_) == 0;
  }
  ~SigpipeBlock() {
    if (!blocked_) return;
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
        timespec zero{0, 0};
        sigtimedwait(&pipe_set_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_set_, old_;
  bool was_pending_ = false, blocked_ = false;
};

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// The last `max_bytes` of what ffmpeg wrote to stderr, trimmed.
std::string read_tail(int fd, size_t max_bytes = 3000) {
  struct stat sb {};
  if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_size <= 0) return {};
  const off_t size = sb.st_size;
  const off_t start = size > static_cast<off_t>(max_bytes) ? size - static_cast<off_t>(max_bytes) : 0;
  std::string text(static_cast<size_t>(size - start), '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t r = pread(fd, text.data() + got, text.size() - got, start + static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  text.resize(got);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  return start > 0 ? "..." + text : text;
}

std::string format_fps(double fps) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.12g", fps);
  return buf;
}

}  // namespace

void encode_video_mp4(const std::string& path, const at::Tensor& frames, double fps, int crf,
                      int upscale) {
  VIDIT_CHECK(frames.defined() && frames.dim() == 4 && frames.size(3) == 3, "encode_video_mp4('",
              path, "'): frames must be [T, H, W, 3] RGB, got ",
              frames.defined() ? frames.sizes() : at::IntArrayRef{});
  VIDIT_CHECK(frames.scalar_type() == at::kByte, "encode_video_mp4('", path,
              "'): frames must be uint8 (0..255), got ", frames.scalar_type(),
              "; convert with (x * 255).round().clamp(0, 255).to(at::kByte)");
  VIDIT_CHECK(frames.size(0) > 0 && frames.size(1) > 0 && frames.size(2) > 0, "encode_video_mp4('",
              path, "'): frames must not be empty, got ", frames.sizes());
  VIDIT_CHECK(std::isfinite(fps) && fps > 0, "encode_video_mp4('", path,
              "'): fps must be a positive number, got ", fps);
  VIDIT_CHECK(crf >= 0 && crf <= 51, "encode_video_mp4('", path,
              "'): crf must be in [0, 51] (0 = lossless, 12 = near lossless, 23 = x264 default), "
              "got ", crf);
  VIDIT_CHECK(upscale >= 1 && upscale <= 64, "encode_video_mp4('", path,
              "'): upscale must be an integer factor in [1, 64], got ", upscale);
  VIDIT_CHECK(!path.empty(), "encode_video_mp4: the output path is empty");
  {
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    VIDIT_CHECK(parent.empty() || std::filesystem::is_directory(parent, ec), "encode_video_mp4('",
                path, "'): the output directory '", parent.string(),
                "' does not exist; create it first");
  }

  const at::Tensor data = frames.to(at::kCPU).contiguous();
  const int64_t T = data.size(0), H = data.size(1), W = data.size(2);

  // The scale filter does both the nearest-neighbour upscale and the RGB -> YUV conversion, with
  // BT.709 limited range declared in the stream so that players and decode_video agree on it.
  const std::string filter = "scale=w=iw*" + std::to_string(upscale) + ":h=ih*" +
                             std::to_string(upscale) +
                             ":flags=neighbor+accurate_rnd+full_chroma_int"
                             ":out_color_matrix=bt709:out_range=tv,format=yuv444p";
  const std::vector<std::string> args = {
      "ffmpeg", "-hide_banner", "-nostats", "-loglevel", "error", "-y",
      "-f", "rawvideo", "-pix_fmt", "rgb24", "-video_size",
      std::to_string(W) + "x" + std::to_string(H), "-framerate", format_fps(fps), "-i", "pipe:0",
      "-an", "-vf", filter, "-c:v", "libx264", "-preset", "medium", "-crf", std::to_string(crf),
      "-pix_fmt", "yuv444p", "-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc",
      "bt709", "-color_range", "tv", "-movflags", "+faststart", "-f", "mp4",
      "file:" + path};  // "file:": a colon in the path is not a protocol
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  // ffmpeg's stderr goes to an already-unlinked temp file: nothing to clean up on any path.
  std::string tmpl = (std::filesystem::temp_directory_path() / "vidit_ffmpeg_stderr_XXXXXX").string();
  Fd err_file(mkostemp(tmpl.data(), O_CLOEXEC));
  VIDIT_CHECK(err_file.fd >= 0, "encode_video_mp4('", path, "'): cannot create a temp file in '",
              std::filesystem::temp_directory_path().string(), "': ", errno_text(errno));
  ::unlink(tmpl.c_str());

  int pipe_fds[2];
  VIDIT_CHECK(pipe2(pipe_fds, O_CLOEXEC) == 0, "encode_video_mp4('", path,
              "'): cannot create a pipe to ffmpeg: ", errno_text(errno));
  Fd read_end(pipe_fds[0]), write_end(pipe_fds[1]);

  SpawnActions fa;
  VIDIT_CHECK(fa.ok, "encode_video_mp4('", path, "'): posix_spawn_file_actions_init failed");
  int rc = posix_spawn_file_actions_adddup2(&fa.actions, read_end.fd, STDIN_FILENO);
  if (rc == 0)
    rc = posix_spawn_file_actions_addopen(&fa.actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  if (rc == 0) rc = posix_spawn_file_actions_adddup2(&fa.actions, err_file.fd, STDERR_FILENO);
  VIDIT_CHECK(rc == 0, "encode_video_mp4('", path, "'): preparing to start ffmpeg failed: ",
              errno_text(rc));

  pid_t pid = -1;
  rc = posix_spawnp(&pid, "ffmpeg", &fa.actions, nullptr, argv.data(), environ);
  VIDIT_CHECK(rc == 0, "encode_video_mp4('", path, "'): cannot run the ffmpeg program (",
              errno_text(rc), "); install it (Debian/Ubuntu: apt-get install ffmpeg) and make sure "
              "it is on PATH");
  read_end.reset();

  // From here on nothing throws until the child has been reaped.
  int write_errno = 0;
  {
    SigpipeBlock block;
    const auto* p = static_cast<const char*>(data.const_data_ptr());
    size_t left = static_cast<size_t>(data.numel());
    while (left > 0) {
      ssize_t n = ::write(write_end.fd, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        write_errno = errno;
        break;
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    write_end.reset();  // EOF for ffmpeg
  }
  int status = 0;
  pid_t waited;
  do {
    waited = ::waitpid(pid, &status, 0);
  } while (waited < 0 && errno == EINTR);
  const int wait_errno = waited < 0 ? errno : 0;

  const std::string tail = read_tail(err_file.fd);
  const std::string ffmpeg_says =
      tail.empty() ? std::string(" (ffmpeg printed nothing)") : "; ffmpeg says:\n" + tail;
  VIDIT_CHECK(wait_errno == 0, "encode_video_mp4('", path, "'): waiting for ffmpeg failed: ",
              errno_text(wait_errno));
  if (WIFSIGNALED(status))
    fail("encode_video_mp4('", path, "'): ffmpeg was killed by signal ", WTERMSIG(status),
         ffmpeg_says);
  VIDIT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "encode_video_mp4('", path,
              "'): ffmpeg failed with exit code ", WEXITSTATUS(status), " encoding ", T,
              " frames of ", W, "x", H, " (ffmpeg needs libx264: check `ffmpeg -encoders | grep "
              "libx264`)",
              ffmpeg_says);
  VIDIT_CHECK(write_errno == 0, "encode_video_mp4('", path,
              "'): writing frames to ffmpeg failed: ", errno_text(write_errno), ffmpeg_says);
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  VIDIT_CHECK(!ec && size > 0, "encode_video_mp4('", path,
              "'): ffmpeg reported success but the file is missing or empty", ffmpeg_says);
}

}  // namespace vidit

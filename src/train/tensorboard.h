// TensorBoard event files, written natively (no protobuf library, no Python).
//
// An event file is a sequence of records. Each record is
//   uint64 length | uint32 masked_crc32c(the 8 length bytes) | length bytes of data | uint32 masked_crc32c(data)
// all little-endian, where masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xa282ead8 (crc32c is the
// Castagnoli CRC). Each record's data is one serialized `tensorboard.Event` protobuf message:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; Image image = 4; HistogramProto histo = 5;
//             TensorProto tensor = 8; SummaryMetadata metadata = 9; }
// The first record of a file carries only file_version = "brain.Event:2". A scalar is a Value with
// simple_value (TensorBoard keeps scalars as float32), a histogram a HistogramProto (min, max, num,
// sum, sum_squares, bucket_limit, bucket), an image an Image (height, width, colorspace = channels,
// PNG bytes), a text a string TensorProto whose metadata names the "text" plugin. The few protobuf
// encodings needed (varint, fixed32, fixed64, length-delimited) are written by hand in the .cpp.
//
// TensorBoard reads every file named `events.out.tfevents.*` in a run directory, in name order. The
// writer opens a new file per run (`events.out.tfevents.<unix seconds>.<host>.<pid>.<n>`), so a resumed
// run adds a file beside those of the runs before it; `first_step` and `last_step_written()` keep it from
// writing steps those files already hold (TensorBoard would show such a step twice).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace at {
class Tensor;  // ATen/ATen.h is needed only by the .cpp, which reads the tensor's values.
}

namespace vidit {

struct StepMetrics;

struct TensorBoardOptions {
  // Buffered records go to the file at least this often (a background thread), on flush() and when
  // the writer is destroyed. <= 0: every add_* call writes through at once.
  double flush_seconds = 5;
  // add_* calls for a step below this are dropped: a resumed run sets it past the steps that the
  // runs before it wrote (see last_step_written()).
  int64_t first_step = 0;
};

// Writes one event file. Thread-safe: any thread may call any method; each add_* only appends to an
// in-memory buffer (the file is written outside the buffer's lock, so a slow file system does not
// stall the caller beyond the flush it asked for).
//
// Failure: it never throws and never stops a run. When the directory cannot be created or the file
// cannot be opened or written (permissions, disk full, ...), it prints one warning to stderr naming
// the path and the system's error, turns itself off (ok() becomes false) and every later call is a
// no-op. Records already written stay readable: TensorBoard stops at a torn last record.
class TensorBoardWriter {
 public:
  // Opens a new event file in `dir` (created with its parents when missing).
  explicit TensorBoardWriter(const std::string& dir, TensorBoardOptions options = {});

  // Writes (appends) to exactly `path` instead of a new file in a directory: for tests (e.g.
  // /dev/full) and tools that choose the name themselves.
  struct ToFile {
    std::string path;
  };
  explicit TensorBoardWriter(ToFile file, TensorBoardOptions options = {});

  // Flushes what is buffered and closes the file.
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // `wall_time`: seconds since the Unix epoch; < 0 means now.
  void add_scalar(const std::string& tag, int64_t step, double value, double wall_time = -1);

  // A histogram of `values` in TensorFlow's default buckets (edges ±1e-12·1.1^k up to ±1e20, then
  // ±DBL_MAX, and 0; runs of empty buckets are merged). Non-finite values are left out of the
  // histogram; a histogram of no finite values is not written.
  void add_histogram(const std::string& tag, int64_t step, const std::vector<double>& values,
                     double wall_time = -1);
  // The same of a tensor of any shape, dtype and device (its values are copied to the CPU as float).
  void add_histogram(const std::string& tag, int64_t step, const at::Tensor& values, double wall_time = -1);

  // `png`: an encoded PNG image (encode_png() makes one) of `height` x `width` pixels with `channels`
  // channels (1 gray, 2 gray + alpha, 3 RGB, 4 RGBA).
  void add_image(const std::string& tag, int64_t step, const std::string& png, int height, int width,
                 int channels, double wall_time = -1);

  // A markdown text, shown by TensorBoard's text plugin.
  void add_text(const std::string& tag, int64_t step, const std::string& markdown, double wall_time = -1);

  // The training step's metrics under "train/...", "perf/..." and "time/..." tags (mfu and
  // comm_wait_s only when known, i.e. >= 0; slowest_score only in a distributed run).
  void add_step_metrics(const StepMetrics& m, double wall_time = -1);

  // Writes what is buffered to the file (not fsync'd: TensorBoard reads it from the page cache).
  void flush();

  // False once a failure has turned the writer off (or it never opened).
  bool ok() const;
  // The event file's path (empty when it could not be chosen).
  const std::string& path() const { return path_; }

 private:
  void start();
  void append_event(const std::string& event_bytes);
  void disable(const std::string& what, int err);
  void flush_loop();
  bool keep(int64_t step) const;

  TensorBoardOptions options_;
  std::string path_;
  int fd_ = -1;

  mutable std::mutex mutex_;   // guards buffer_, stopping_, disabled_
  std::mutex io_mutex_;        // guards writes to fd_: one at a time, in buffer order
  std::condition_variable wake_;
  std::string buffer_;         // whole records not yet written
  bool stopping_ = false;
  bool disabled_ = false;
  std::thread flusher_;
};

// One summary value read back from an event file.
struct TensorBoardEvent {
  enum class Kind { scalar, histogram, image, text, other };
  std::string tag;
  int64_t step = 0;
  double wall_time = 0;
  Kind kind = Kind::other;
  double value = 0;  // the scalar (float32 precision); for a histogram its number of values
};

// Reads the summary values of an event file, in file order. It stops, without error, at a torn or
// corrupt record (bad length or CRC: a run killed while writing); a file that cannot be opened gives
// vidit::Error naming it.
std::vector<TensorBoardEvent> read_tensorboard_events(const std::string& path);

// The highest step of any summary value in the event files (`events.out.tfevents.*`) of `dir`, or -1
// when there are none (or no dir). Unreadable files are skipped. Never throws. A resumed run
// passes first_step = max(its first step, last_step_written(dir) + 1).
int64_t last_step_written(const std::string& dir);

// Encodes 8-bit pixels, row-major height x width x channels (1..4), as a PNG. Throws vidit::Error
// when the sizes do not match or libpng fails.
std::string encode_png(const uint8_t* pixels, int height, int width, int channels);

// CRC-32C (Castagnoli) of `n` bytes, and TensorBoard's masked form of it.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace vidit

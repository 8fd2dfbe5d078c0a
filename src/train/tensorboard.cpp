// TensorBoard event files: record framing with masked CRC-32C, hand-written protobuf encoding of the
// few messages TensorBoard needs, a buffered writer that turns itself off on I/O errors, and a
// reader of the same subset (for tests and for resuming). The format is described in tensorboard.h.
#include "train/tensorboard.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <png.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <system_error>

#include "core/error.h"
#include "resilience/run_lock.h"  // host_name()
#include "train/metrics.h"

namespace vidit {
namespace {

// ---- CRC-32C -------------------------------------------------------------------------------------
// The reflected Castagnoli polynomial; one table lookup per byte is ample for a few KB per step.
constexpr uint32_t kCastagnoli = 0x82F63B78u;

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCastagnoli : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

// ---- little-endian bytes -------------------------------------------------------------------------
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}
uint64_t double_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- protobuf encoding ---------------------------------------------------------------------------
// A message under construction. Wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.
struct ProtoOut {
  std::string bytes;

  void raw_varint(uint64_t v) {
    while (v >= 0x80) {
      bytes.push_back(char((v & 0x7f) | 0x80));
      v >>= 7;
    }
    bytes.push_back(char(v));
  }
  void key(uint32_t field, int wire) { raw_varint((uint64_t(field) << 3) | uint64_t(wire)); }
  // int32 / int64 / enum fields (a negative value takes ten bytes, as protobuf writes it).
  ProtoOut& varint(uint32_t field, int64_t v) {
    key(field, 0);
    raw_varint(uint64_t(v));
    return *this;
  }
  ProtoOut& f64(uint32_t field, double v) {
    key(field, 1);
    put_le(bytes, double_bits(v), 8);
    return *this;
  }
  ProtoOut& f32(uint32_t field, float v) {
    key(field, 5);
    put_le(bytes, float_bits(v), 4);
    return *this;
  }
  ProtoOut& string(uint32_t field, std::string_view s) {
    key(field, 2);
    raw_varint(s.size());
    bytes.append(s.data(), s.size());
    return *this;
  }
  ProtoOut& message(uint32_t field, const ProtoOut& m) { return string(field, m.bytes); }
  ProtoOut& packed_f64(uint32_t field, const std::vector<double>& v) {
    key(field, 2);
    raw_varint(v.size() * 8);
    for (double d : v) put_le(bytes, double_bits(d), 8);
    return *this;
  }
};

// ---- protobuf decoding (the subset we write) -----------------------------------------------------
struct ProtoIn {
  const uint8_t* p;
  const uint8_t* end;
  bool good = true;

  explicit ProtoIn(std::string_view s)
      : p(reinterpret_cast<const uint8_t*>(s.data())), end(p + s.size()) {}

  uint64_t raw_varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) break;
      const uint8_t b = *p++;
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    good = false;
    return 0;
  }
  // The next field's number and wire type; false at the end of the message or on malformed input.
  bool next(uint32_t& field, int& wire) {
    if (!good || p >= end) return false;
    const uint64_t k = raw_varint();
    field = uint32_t(k >> 3);
    wire = int(k & 7);
    return good && field != 0;
  }
  const uint8_t* take(size_t n) {
    if (size_t(end - p) < n) {
      good = false;
      p = end;
      return nullptr;
    }
    const uint8_t* at = p;
    p += n;
    return at;
  }
  double f64() {
    const uint8_t* b = take(8);
    if (!b) return 0;
    const uint64_t u = get_le(b, 8);
    double d;
    std::memcpy(&d, &u, 8);
    return d;
  }
  float f32() {
    const uint8_t* b = take(4);
    if (!b) return 0;
    const uint32_t u = uint32_t(get_le(b, 4));
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  std::string_view string() {
    const uint64_t n = raw_varint();
    const uint8_t* b = good ? take(n) : nullptr;
    return b ? std::string_view(reinterpret_cast<const char*>(b), n) : std::string_view();
  }
  void skip(int wire) {
    switch (wire) {
      case 0: raw_varint(); break;
      case 1: take(8); break;
      case 2: string(); break;
      case 5: take(4); break;
      default: good = false;  // groups (3, 4) are never written by TensorBoard's writers
    }
  }
};

// ---- the messages --------------------------------------------------------------------------------
// Field numbers of tensorboard/compat/proto/{event,summary,histogram,tensor}.proto.
namespace ev {  // Event
constexpr uint32_t wall_time = 1, step = 2, file_version = 3, summary = 5;
}
namespace sm {  // Summary
constexpr uint32_t value = 1;
}
namespace val {  // Summary.Value
constexpr uint32_t tag = 1, simple_value = 2, image = 4, histo = 5, tensor = 8, metadata = 9;
}
namespace img {  // Summary.Image
constexpr uint32_t height = 1, width = 2, colorspace = 3, encoded = 4;
}
namespace hist {  // HistogramProto
constexpr uint32_t min = 1, max = 2, num = 3, sum = 4, sum_squares = 5, bucket_limit = 6, bucket = 7;
}
namespace tensor {  // TensorProto (DT_STRING = 7 in types.proto)
constexpr uint32_t dtype = 1, shape = 2, string_val = 8;
constexpr int64_t dt_string = 7;
}
namespace meta {  // SummaryMetadata, its PluginData (DATA_CLASS_TENSOR = 2)
constexpr uint32_t plugin_data = 1, data_class = 4, plugin_name = 1, plugin_content = 2;
constexpr int64_t data_class_tensor = 2;
}

ProtoOut event_bytes(double wall_time, int64_t step, const std::vector<ProtoOut>& values) {
  ProtoOut summary;
  for (const ProtoOut& v : values) summary.message(sm::value, v);
  ProtoOut e;
  e.f64(ev::wall_time, wall_time).varint(ev::step, step).message(ev::summary, summary);
  return e;
}

ProtoOut scalar_value(const std::string& tag, double value) {
  ProtoOut v;
  v.string(val::tag, tag).f32(val::simple_value, float(value));
  return v;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
double or_now(double wall_time) { return wall_time < 0 ? now_seconds() : wall_time; }

// TensorFlow's default histogram bucket edges: 0, and ±1e-12 growing by 10% up to ±1e20, closed by
// ±DBL_MAX; a value v counts in the first bucket whose edge is > v.
const std::vector<double>& default_bucket_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> pos;
    for (double v = 1e-12; v < 1e20; v *= 1.1) pos.push_back(v);
    pos.push_back(DBL_MAX);
    std::vector<double> all;
    all.reserve(2 * pos.size() + 1);
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), pos.begin(), pos.end());
    return all;
  }();
  return limits;
}

// A HistogramProto of n values (float or double); false when none is finite.
template <typename T>
bool histogram_proto(const T* values, size_t n, ProtoOut& out) {
  const std::vector<double>& limits = default_bucket_limits();
  std::vector<double> counts(limits.size(), 0.0);
  double lo = INFINITY, hi = -INFINITY, num = 0, sum = 0, sum_sq = 0;
  for (size_t i = 0; i < n; ++i) {
    const double v = double(values[i]);
    if (!std::isfinite(v)) continue;
    lo = std::min(lo, v), hi = std::max(hi, v);
    num += 1, sum += v, sum_sq += v * v;
    size_t b = size_t(std::upper_bound(limits.begin(), limits.end(), v) - limits.begin());
    counts[std::min(b, limits.size() - 1)] += 1;
  }
  if (num == 0) return false;
  // A run of empty buckets becomes one bucket ending at the run's last edge, so the proto holds the
  // occupied buckets and the gaps between them, not all ~1500 edges.
  std::vector<double> edge, count;
  for (size_t i = 0; i < limits.size();) {
    double e = limits[i], c = counts[i];
    ++i;
    if (c == 0)
      while (i < limits.size() && counts[i] == 0) e = limits[i], c = counts[i], ++i;
    edge.push_back(e);
    count.push_back(c);
  }
  out.f64(hist::min, lo).f64(hist::max, hi).f64(hist::num, num).f64(hist::sum, sum);
  out.f64(hist::sum_squares, sum_sq).packed_f64(hist::bucket_limit, edge).packed_f64(hist::bucket, count);
  return true;
}

// The record framing: length, its masked CRC, the data, the data's masked CRC.
std::string frame_record(const std::string& data) {
  std::string rec;
  rec.reserve(data.size() + 16);
  put_le(rec, data.size(), 8);
  put_le(rec, masked_crc32c(rec.data(), 8), 4);
  rec += data;
  put_le(rec, masked_crc32c(data.data(), data.size()), 4);
  return rec;
}

bool write_all(int fd, const std::string& bytes, int& err) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      return false;
    }
    if (n == 0) {
      err = EIO;
      return false;
    }
    done += size_t(n);
  }
  return true;
}

// Distinguishes the files of writers opened by one process within one second.
std::atomic<int> g_file_counter{0};

// ---- PNG in memory -------------------------------------------------------------------------------
void png_append(png_structp png, png_bytep data, png_size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), n);
}
void png_no_flush(png_structp) {}

// Plain C style (no objects with destructors between setjmp and a longjmp out of libpng).
bool png_encode_into(std::string* out, const uint8_t* pixels, int height, int width, int channels) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  static const int kColor[5] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                                PNG_COLOR_TYPE_RGB_ALPHA};
  png_set_write_fn(png, out, png_append, png_no_flush);
  png_set_IHDR(png, info, png_uint_32(width), png_uint_32(height), 8, kColor[channels], PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < height; ++y)
    png_write_row(png, const_cast<png_bytep>(pixels + size_t(y) * size_t(width) * size_t(channels)));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

}  // namespace

// ---- CRC -----------------------------------------------------------------------------------------
uint32_t crc32c(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = kCrcTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string encode_png(const uint8_t* pixels, int height, int width, int channels) {
  VIDIT_CHECK(height > 0 && width > 0 && channels >= 1 && channels <= 4,
              "encode_png: bad image size ", height, "x", width, "x", channels,
              " (need positive height and width, 1 to 4 channels)");
  VIDIT_CHECK(pixels != nullptr, "encode_png: no pixels");
  std::string out;
  VIDIT_CHECK(png_encode_into(&out, pixels, height, width, channels), "encode_png: libpng failed encoding a ",
              height, "x", width, "x", channels, " image");
  return out;
}

// ---- the writer ----------------------------------------------------------------------------------
TensorBoardWriter::TensorBoardWriter(const std::string& dir, TensorBoardOptions options) : options_(options) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    path_ = dir;
    disable("cannot create the TensorBoard directory", ec.value());
    return;
  }
  const std::string base = dir + "/events.out.tfevents." + std::to_string(static_cast<long long>(std::time(nullptr))) + "." +
                           host_name() + "." + std::to_string(long(::getpid())) + ".";
  // A name already taken (another writer of this process in the same second) takes the next number.
  for (int attempt = 0; attempt < 1000; ++attempt) {
    path_ = base + std::to_string(g_file_counter++);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ >= 0 || errno != EEXIST) break;
  }
  if (fd_ < 0) {
    disable("cannot create the TensorBoard event file", errno);
    return;
  }
  start();
}

TensorBoardWriter::TensorBoardWriter(ToFile file, TensorBoardOptions options) : options_(options) {
  path_ = file.path;
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    disable("cannot open the TensorBoard event file", errno);
    return;
  }
  start();
}

// Writes the file's first record at once (so a file that cannot be written is known now) and starts
// the flushing thread.
void TensorBoardWriter::start() {
  ProtoOut first;
  first.f64(ev::wall_time, now_seconds()).string(ev::file_version, "brain.Event:2");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    buffer_ = frame_record(first.bytes);
  }
  flush();
  if (options_.flush_seconds > 0 && ok()) flusher_ = std::thread([this] { flush_loop(); });
}

TensorBoardWriter::~TensorBoardWriter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (flusher_.joinable()) flusher_.join();
  flush();
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::flush_loop() {
  const auto period = std::chrono::duration<double>(options_.flush_seconds);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_ && !disabled_) {
    wake_.wait_for(lock, period, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    flush();
    lock.lock();
  }
}

void TensorBoardWriter::flush() {
  // io_mutex_ first: the bytes taken from the buffer are written before any taken after them.
  std::lock_guard<std::mutex> io(io_mutex_);
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (disabled_) return;
    out.swap(buffer_);
  }
  if (out.empty()) return;
  int err = 0;
  if (!write_all(fd_, out, err)) disable("cannot write the TensorBoard event file", err);
}

bool TensorBoardWriter::ok() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !disabled_;
}

void TensorBoardWriter::disable(const std::string& what, int err) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (disabled_) return;
    disabled_ = true;
    buffer_.clear();
  }
  wake_.notify_all();
  std::fprintf(stderr, "warning: %s '%s': %s; TensorBoard logging is off for the rest of this run\n", what.c_str(),
               path_.c_str(), std::strerror(err));
}

bool TensorBoardWriter::keep(int64_t step) const { return step >= options_.first_step; }

void TensorBoardWriter::append_event(const std::string& event) {
  const std::string record = frame_record(event);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (disabled_) return;
    buffer_ += record;
  }
  if (options_.flush_seconds <= 0) flush();
}

void TensorBoardWriter::add_scalar(const std::string& tag, int64_t step, double value, double wall_time) {
  if (!keep(step) || !ok()) return;
  append_event(event_bytes(or_now(wall_time), step, {scalar_value(tag, value)}).bytes);
}

void TensorBoardWriter::add_histogram(const std::string& tag, int64_t step, const std::vector<double>& values,
                                      double wall_time) {
  if (!keep(step) || !ok()) return;
  ProtoOut h;
  if (!histogram_proto(values.data(), values.size(), h)) return;
  ProtoOut v;
  v.string(val::tag, tag).message(val::histo, h);
  append_event(event_bytes(or_now(wall_time), step, {v}).bytes);
}

void TensorBoardWriter::add_histogram(const std::string& tag, int64_t step, const at::Tensor& values,
                                      double wall_time) {
  if (!keep(step) || !ok() || !values.defined()) return;
  // float, not double: a 14B model's largest weight is 70M values, 280 MB as float on the host.
  const at::Tensor t = values.detach().to(at::kCPU).to(at::kFloat).contiguous();
  ProtoOut h;
  if (!histogram_proto(t.data_ptr<float>(), size_t(t.numel()), h)) return;
  ProtoOut v;
  v.string(val::tag, tag).message(val::histo, h);
  append_event(event_bytes(or_now(wall_time), step, {v}).bytes);
}

void TensorBoardWriter::add_image(const std::string& tag, int64_t step, const std::string& png, int height,
                                  int width, int channels, double wall_time) {
  if (!keep(step) || !ok()) return;
  ProtoOut im;
  im.varint(img::height, height).varint(img::width, width).varint(img::colorspace, channels);
  im.string(img::encoded, png);
  ProtoOut v;
  v.string(val::tag, tag).message(val::image, im);
  append_event(event_bytes(or_now(wall_time), step, {v}).bytes);
}

void TensorBoardWriter::add_text(const std::string& tag, int64_t step, const std::string& markdown,
                                 double wall_time) {
  if (!keep(step) || !ok()) return;
  // The text plugin's data: a scalar (empty shape) string tensor; its plugin content (a
  // TextPluginData of version 0) serializes to no bytes.
  ProtoOut plugin;
  plugin.string(meta::plugin_name, "text").string(meta::plugin_content, "");
  ProtoOut metadata;
  metadata.message(meta::plugin_data, plugin).varint(meta::data_class, meta::data_class_tensor);
  ProtoOut t;
  t.varint(tensor::dtype, tensor::dt_string).message(tensor::shape, ProtoOut{}).string(tensor::string_val, markdown);
  ProtoOut v;
  v.string(val::tag, tag).message(val::metadata, metadata).message(val::tensor, t);
  append_event(event_bytes(or_now(wall_time), step, {v}).bytes);
}

void TensorBoardWriter::add_step_metrics(const StepMetrics& m, double wall_time) {
  if (!keep(m.step) || !ok()) return;
  // One event for the whole step: its values reach the file together or not at all.
  std::vector<ProtoOut> values = {
      scalar_value("train/loss", m.loss),
      scalar_value("train/grad_norm", m.grad_norm),
      scalar_value("train/lr", m.lr),
      scalar_value("perf/tokens_per_s", m.tokens_per_s),
      scalar_value("perf/samples_per_s", m.samples_per_s),
      scalar_value("perf/tflops", m.tflops),
      scalar_value("time/step_seconds", m.step_seconds),
      scalar_value("time/data_wait_s", m.data_wait_s),
  };
  if (m.mfu >= 0) values.push_back(scalar_value("perf/mfu", m.mfu));
  if (m.comm_wait_s >= 0) values.push_back(scalar_value("time/comm_wait_s", m.comm_wait_s));
  if (m.slowest_rank >= 0) values.push_back(scalar_value("perf/slowest_score", m.slowest_score));
  append_event(event_bytes(or_now(wall_time), m.step, values).bytes);
}

// ---- reading -------------------------------------------------------------------------------------
namespace {

// Appends the summary values of one serialized Event; false when it is malformed.
bool parse_event(std::string_view data, std::vector<TensorBoardEvent>& out) {
  ProtoIn e(data);
  double wall = 0;
  int64_t step = 0;
  std::vector<std::string_view> values;
  uint32_t f;
  int w;
  while (e.next(f, w)) {
    if (f == ev::wall_time && w == 1) wall = e.f64();
    else if (f == ev::step && w == 0) step = int64_t(e.raw_varint());
    else if (f == ev::summary && w == 2) {
      ProtoIn s(e.string());
      while (s.next(f, w)) {
        if (f == sm::value && w == 2) values.push_back(s.string());
        else s.skip(w);
      }
      if (!s.good) return false;
    } else e.skip(w);
  }
  if (!e.good) return false;
  for (std::string_view bytes : values) {
    TensorBoardEvent r;
    r.step = step, r.wall_time = wall;
    bool has_tensor = false, text_plugin = false;
    ProtoIn v(bytes);
    while (v.next(f, w)) {
      if (f == val::tag && w == 2) r.tag = std::string(v.string());
      else if (f == val::simple_value && w == 5) r.kind = TensorBoardEvent::Kind::scalar, r.value = v.f32();
      else if (f == val::image && w == 2) r.kind = TensorBoardEvent::Kind::image, v.string();
      else if (f == val::histo && w == 2) {
        r.kind = TensorBoardEvent::Kind::histogram;
        ProtoIn h(v.string());
        while (h.next(f, w)) {
          if (f == hist::num && w == 1) r.value = h.f64();
          else h.skip(w);
        }
      } else if (f == val::tensor && w == 2) has_tensor = true, v.string();
      else if (f == val::metadata && w == 2) {
        ProtoIn m(v.string());
        while (m.next(f, w)) {
          if (f == meta::plugin_data && w == 2) {
            ProtoIn p(m.string());
            while (p.next(f, w)) {
              if (f == meta::plugin_name && w == 2) text_plugin = p.string() == "text";
              else p.skip(w);
            }
          } else m.skip(w);
        }
      } else v.skip(w);
    }
    if (!v.good) return false;
    if (has_tensor && text_plugin) r.kind = TensorBoardEvent::Kind::text;
    out.push_back(std::move(r));
  }
  return true;
}

}  // namespace

std::vector<TensorBoardEvent> read_tensorboard_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open TensorBoard event file '", path, "': ", std::strerror(errno));
  std::vector<TensorBoardEvent> out;
  std::string data;
  for (;;) {
    uint8_t head[12];
    if (!in.read(reinterpret_cast<char*>(head), 12)) break;
    if (uint32_t(get_le(head + 8, 4)) != masked_crc32c(head, 8)) break;
    const uint64_t len = get_le(head, 8);
    if (len > (uint64_t(1) << 32)) break;  // no event of ours comes near; a corrupt length
    data.resize(len);
    uint8_t tail[4];
    if (!in.read(data.data(), std::streamsize(len)) || !in.read(reinterpret_cast<char*>(tail), 4)) break;
    if (uint32_t(get_le(tail, 4)) != masked_crc32c(data.data(), data.size())) break;
    if (!parse_event(data, out)) break;
  }
  return out;
}

int64_t last_step_written(const std::string& dir) {
  int64_t last = -1;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().rfind("events.out.tfevents.", 0) != 0) continue;
    try {
      for (const TensorBoardEvent& e : read_tensorboard_events(it->path().string())) last = std::max(last, e.step);
    } catch (const std::exception&) {
      // An unreadable file holds no steps we could avoid repeating.
    }
  }
  return last;
}

}  // namespace vidit

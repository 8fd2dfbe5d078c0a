// safetensors reader and writer (see safetensors.h for the format).
#include "core/safetensors.h"

#include "core/mapped_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/storage.h"
#include "core/tensor_stream.h"

namespace vidit {
namespace {

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
const DtypeName kDtypes[] = {
    {at::kFloat, "F32"},   {at::kDouble, "F64"},  {at::kHalf, "F16"},   {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},    {at::kInt, "I32"},     {at::kShort, "I16"},  {at::kChar, "I8"},
    {at::kByte, "U8"},     {at::kBool, "BOOL"},   {at::kFloat8_e4m3fn, "F8_E4M3"},
    {at::kFloat8_e5m2, "F8_E5M2"},
};

const char* dtype_name(at::ScalarType t, const std::string& key) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  fail("safetensors: tensor '", key, "' has dtype ", c10::toString(t), " which cannot be stored");
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  local_storage().write_atomic(path, bytes);
}

namespace {

// What a safetensors file holding `tensors` (in key order) begins with: the 8-byte little-endian
// length, the JSON header (each tensor's dtype, shape and offsets; `metadata` as __metadata__),
// padded with spaces so that the data that follows starts 8-byte aligned.
std::string header_bytes(const std::map<std::string, TensorInfo>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [key, t] : tensors) {
    const uint64_t bytes = t.bytes();
    header[key] = {{"dtype", dtype_name(t.dtype, key)},
                   {"shape", t.shape},
                   {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  while ((8 + json.size()) % 8 != 0) json.push_back(' ');  // keep the data 8-byte aligned
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

}  // namespace

uint64_t write_safetensors(WritableFile& file, const TensorStream& tensors,
                           const std::map<std::string, std::string>& metadata) {
  const std::string header = header_bytes(tensors.info, metadata);
  file.append(header.data(), header.size());
  // Each tensor straight from its memory (CPU, contiguous: no copy), in the header's order, and
  // dropped before the next is read.
  for (const auto& [key, info] : tensors.info) {
    const at::Tensor c = tensors.get(key).detach().to(at::kCPU).contiguous();
    file.append(c.data_ptr(), size_t(info.bytes()));
  }
  return header.size();
}

uint64_t write_safetensors(WritableFile& file, const TensorMap& tensors, const std::map<std::string, std::string>& metadata) {
  for (const auto& [key, t] : tensors)
    VIDIT_CHECK(t.defined(), "safetensors: tensor '", key, "' is undefined (writing '", file.path(), "')");
  return write_safetensors(file, stream_of(tensors), metadata);
}

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata) {
  local_storage().write_atomic(path, [&](WritableFile& f) { write_safetensors(f, tensors, metadata); });
}

void save_safetensors(const std::string& path, const TensorStream& tensors,
                      const std::map<std::string, std::string>& metadata) {
  local_storage().write_atomic(path, [&](WritableFile& f) { write_safetensors(f, tensors, metadata); });
}

namespace {

TensorMap parse_impl(const uint8_t* data, size_t size, const std::string& name,
                     std::map<std::string, std::string>* metadata, bool copy) {
  VIDIT_CHECK(size >= 8, "'", name, "' is not a safetensors file: only ", size, " bytes");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(data[i]) << (8 * i);
  VIDIT_CHECK(n <= size - 8, "'", name, "' is truncated or not safetensors: header claims ", n,
              " bytes but the file has ", size - 8, " after the length");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(data + 8, data + 8 + n);
  } catch (const std::exception& e) {
    fail("'", name, "': the safetensors header is not valid JSON (", e.what(), ")");
  }
  VIDIT_CHECK(header.is_object(), "'", name, "': the safetensors header must be a JSON object");
  const uint8_t* base = data + 8 + n;
  const size_t avail = size - 8 - n;
  TensorMap out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const auto& v = it.value();
    if (key == "__metadata__") {
      if (metadata && v.is_object())
        for (auto m = v.begin(); m != v.end(); ++m)
          if (m.value().is_string()) (*metadata)[m.key()] = m.value().get<std::string>();
      continue;
    }
    auto bad = [&](const std::string& why) { fail("'", name, "': tensor '", key, "': ", why); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      bad("entry needs dtype, shape and data_offsets");
    if (!v["dtype"].is_string()) bad("dtype must be a string");
    std::string dt = v["dtype"].get<std::string>();
    std::optional<at::ScalarType> type;
    for (const auto& d : kDtypes)
      if (dt == d.name) type = d.type;
    if (!type) bad("unsupported dtype '" + dt + "'");
    if (!v["shape"].is_array()) bad("shape must be an array");
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (const auto& s : v["shape"]) {
      if (!s.is_number_unsigned()) bad("shape entries must be non-negative integers");
      uint64_t d = s.get<uint64_t>();
      if (d > (1ull << 40) || (d && numel > (1ull << 40) / d)) bad("shape is absurdly large");
      numel *= d;
      shape.push_back(static_cast<int64_t>(d));
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      bad("data_offsets must be [begin, end]");
    uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e || e > avail)
      bad("data_offsets [" + std::to_string(b) + ", " + std::to_string(e) + "] exceed the " +
          std::to_string(avail) + " data bytes (file truncated?)");
    uint64_t want = numel * c10::elementSize(*type);
    if (e - b != want)
      bad("holds " + std::to_string(e - b) + " bytes but dtype and shape need " + std::to_string(want));
    if (copy) {
      at::Tensor t = at::empty(shape, at::TensorOptions().dtype(*type));
      if (want) std::memcpy(t.data_ptr(), base + b, want);
      out.emplace(key, std::move(t));
    } else {
      out.emplace(key, at::from_blob(const_cast<uint8_t*>(base + b), shape, at::TensorOptions().dtype(*type)));
    }
  }
  return out;
}

}  // namespace

TensorMap parse_safetensors(const uint8_t* data, size_t size, const std::string& name,
                            std::map<std::string, std::string>* metadata) {
  return parse_impl(data, size, name, metadata, /*copy=*/true);
}

TensorMap view_safetensors(const uint8_t* data, size_t size, const std::string& name) {
  return parse_impl(data, size, name, nullptr, /*copy=*/false);
}

TensorMap map_safetensors(const std::string& path, std::shared_ptr<const MappedFile>* file) {
  auto mapped = std::make_shared<const MappedFile>(path, "weights file");
  TensorMap out;
  for (auto& [key, view] : view_safetensors(mapped->data(), mapped->size(), path)) {
    auto* keep = new std::shared_ptr<const MappedFile>(mapped);  // released with the tensor's storage
    out.emplace(key, at::from_blob(view.data_ptr(), view.sizes(), [keep](void*) { delete keep; }, view.options()));
  }
  if (file) *file = std::move(mapped);
  return out;
}

TensorMap load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  std::ifstream in(path, std::ios::binary);
  VIDIT_CHECK(in, "cannot open '", path, "': ", std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path,
                           metadata);
}

}  // namespace vidit

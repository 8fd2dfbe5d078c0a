// tokenizer.json -> SentencePiece ModelProto bytes (see tokenizer_json.h). The protobuf is written by
// hand: a few varint / fixed32 / length-delimited fields of sentencepiece_model.proto, whose field
// numbers are listed next to each write.
#include "text/tokenizer_json.h"

#include <nlohmann/json.hpp>

#include <bit>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace vidit::text {
namespace {

using nlohmann::json;

// --- protobuf wire format (only what ModelProto needs) ---
class ProtoWriter {
 public:
  void varint_field(int field, uint64_t v) {
    tag(field, 0);
    varint(v);
  }
  // int32 / enum / bool: negative values are sign-extended to 64 bits (ten bytes), as protobuf does.
  void int_field(int field, int64_t v) { varint_field(field, static_cast<uint64_t>(v)); }
  void float_field(int field, float v) {
    tag(field, 5);
    const auto bits = std::bit_cast<uint32_t>(v);
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));  // little-endian
  }
  void bytes_field(int field, std::string_view bytes) {
    tag(field, 2);
    varint(bytes.size());
    out_.append(bytes);
  }
  const std::string& bytes() const { return out_; }

 private:
  void tag(int field, int wire_type) { varint((static_cast<uint64_t>(field) << 3) | wire_type); }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7F) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  std::string out_;
};

// sentencepiece_model.proto: ModelProto.SentencePiece.Type
enum PieceType { NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6 };

struct Piece {
  std::string piece;
  float score = 0;
  PieceType type = NORMAL;
};

struct Spec {
  std::vector<Piece> pieces;
  bool byte_fallback = false;
  std::string charsmap;  // decoded precompiled_charsmap, may be empty
  bool add_dummy_prefix = false;
  bool remove_extra_whitespaces = false;
  bool escape_whitespaces = false;
  int unk_id = -1, bos_id = -1, eos_id = -1, pad_id = -1;
  bool any_special_added = false;  // added_tokens lists special tokens (other than unk)
};

std::string base64_decode(const std::string& in, const std::string& name, const char* key) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < in.size() && in[i] != '='; ++i) {
    const int v = value(in[i]);
    VIDIT_CHECK(v >= 0, "tokenizer: '", name, "': ", key, " is not base64 (character ", i, ")");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  for (; i < in.size(); ++i)
    VIDIT_CHECK(in[i] == '=', "tokenizer: '", name, "': ", key, " is not base64 (character ", i, " after padding)");
  return out;
}

// The key's value as a string, "" when absent or null.
std::string str(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return "";
  return j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
}

// Sequence{key: [...]} flattened; a single rule as a list of one; null as none.
std::vector<json> flatten(const json& j, const char* list_key) {
  std::vector<json> out;
  if (j.is_null()) return out;
  if (str(j, "type") == "Sequence" && j.contains(list_key) && j[list_key].is_array()) {
    for (const auto& e : j[list_key]) {
      auto sub = flatten(e, list_key);
      out.insert(out.end(), sub.begin(), sub.end());
    }
    return out;
  }
  out.push_back(j);
  return out;
}

void read_model(const json& root, const std::string& name, Spec& spec) {
  VIDIT_CHECK(root.contains("model") && root["model"].is_object(), "tokenizer: '", name,
              "' has no \"model\" object: not a Hugging Face tokenizer.json");
  const json& model = root["model"];
  const std::string type = str(model, "type");
  VIDIT_CHECK(type == "Unigram", "tokenizer: '", name, "': model.type is \"", type,
              "\", but vidit reads only \"Unigram\" tokenizer.json files (SentencePiece unigram models such as "
              "umT5's); pass the spiece.model instead");
  VIDIT_CHECK(model.contains("vocab") && model["vocab"].is_array() && !model["vocab"].empty(), "tokenizer: '",
              name, "': model.vocab is missing or empty");
  for (const auto& entry : model["vocab"]) {
    VIDIT_CHECK(entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_number(),
                "tokenizer: '", name, "': model.vocab entry ", spec.pieces.size(), " is not [piece, score]");
    spec.pieces.push_back({entry[0].get<std::string>(), entry[1].get<float>(), NORMAL});
  }
  VIDIT_CHECK(model.contains("unk_id") && model["unk_id"].is_number_integer(), "tokenizer: '", name,
              "': model.unk_id is missing: SentencePiece needs an unknown piece");
  spec.unk_id = model["unk_id"].get<int>();
  VIDIT_CHECK(spec.unk_id >= 0 && spec.unk_id < static_cast<int>(spec.pieces.size()), "tokenizer: '", name,
              "': model.unk_id ", spec.unk_id, " is outside the vocab (", spec.pieces.size(), " pieces)");
  spec.byte_fallback = model.value("byte_fallback", false);
  if (spec.byte_fallback) {
    for (Piece& p : spec.pieces) {
      const std::string& s = p.piece;
      if (s.size() == 6 && s.rfind("<0x", 0) == 0 && s[5] == '>' && std::isxdigit((unsigned char)s[3]) &&
          std::isxdigit((unsigned char)s[4]))
        p.type = BYTE;
    }
  }
}

void read_added_tokens(const json& root, const std::string& name, Spec& spec) {
  if (!root.contains("added_tokens") || root["added_tokens"].is_null()) return;
  VIDIT_CHECK(root["added_tokens"].is_array(), "tokenizer: '", name, "': added_tokens is not a list");
  for (const auto& t : root["added_tokens"]) {
    VIDIT_CHECK(t.is_object() && t.contains("id") && t["id"].is_number_integer() && t.contains("content") &&
                    t["content"].is_string(),
                "tokenizer: '", name, "': an added_tokens entry lacks id or content: ", t.dump());
    const int id = t["id"].get<int>();
    const std::string content = t["content"].get<std::string>();
    const bool special = t.value("special", false);
    if (id == static_cast<int>(spec.pieces.size())) {
      spec.pieces.push_back({content, 0.0f, NORMAL});  // a token added after the vocab: one more piece
    }
    VIDIT_CHECK(id >= 0 && id < static_cast<int>(spec.pieces.size()) && spec.pieces[id].piece == content,
                "tokenizer: '", name, "': added token \"", content, "\" has id ", id,
                ", which is not that piece of model.vocab (nor the next id): SentencePiece cannot express it");
    if (id == spec.unk_id) continue;
    spec.pieces[id].type = special ? CONTROL : USER_DEFINED;
    spec.any_special_added |= special;
  }
  spec.pieces[spec.unk_id].type = UNKNOWN;
}

void read_normalizer(const json& root, const std::string& name, Spec& spec) {
  const json normalizer = root.value("normalizer", json());
  const std::vector<json> rules = flatten(normalizer, "normalizers");
  for (size_t i = 0; i < rules.size(); ++i) {
    const json& r = rules[i];
    const std::string type = str(r, "type");
    if (type == "Precompiled") {
      VIDIT_CHECK(i == 0, "tokenizer: '", name, "': normalizer \"Precompiled\" comes after another rule (",
                  normalizer.dump().substr(0, 200), "); SentencePiece applies its charsmap first");
      spec.charsmap = base64_decode(str(r, "precompiled_charsmap"), name, "normalizer.precompiled_charsmap");
      continue;
    }
    if (type == "Strip") {  // SentencePiece's remove_extra_whitespaces drops leading and trailing spaces
      spec.remove_extra_whitespaces = true;
      continue;
    }
    if (type == "Replace") {
      const json pattern = r.value("pattern", json());
      const std::string regex = str(pattern, "Regex"), plain = str(pattern, "String");
      const std::string content = str(r, "content");
      if (regex == " {2,}" && (content == " " || content == "\u2581")) {
        spec.remove_extra_whitespaces = true;
        continue;
      }
      if (regex == "\\A +| +\\z" && content.empty()) {
        spec.remove_extra_whitespaces = true;
        continue;
      }
      if (plain == " " && content == "\u2581") {
        spec.escape_whitespaces = true;
        continue;
      }
      if (regex == "\\A\u2581" && content == "\u2581\u2581") continue;  // the converters' fix-up for the dummy prefix
    }
    fail("tokenizer: '", name, "': normalizer rule ", r.dump().substr(0, 200),
         " has no SentencePiece equivalent (vidit reads Precompiled and the whitespace rules transformers writes "
         "for SentencePiece models); pass the spiece.model instead");
  }
}

void read_pre_tokenizer(const json& root, const std::string& name, Spec& spec) {
  const json pre = root.value("pre_tokenizer", json());
  bool metaspace = false;
  for (const json& r : flatten(pre, "pretokenizers")) {
    const std::string type = str(r, "type");
    if (type == "WhitespaceSplit" && !metaspace) {
      spec.remove_extra_whitespaces = true;
      continue;
    }
    if (type == "Metaspace") {
      const std::string replacement = str(r, "replacement");
      VIDIT_CHECK(replacement == "\u2581", "tokenizer: '", name, "': pre_tokenizer Metaspace replaces spaces with \"",
                  replacement, "\"; SentencePiece uses \"\u2581\" (U+2581)");
      const std::string scheme = str(r, "prepend_scheme");
      if (!scheme.empty()) {
        VIDIT_CHECK(scheme == "always" || scheme == "first" || scheme == "never", "tokenizer: '", name,
                    "': pre_tokenizer Metaspace has an unknown prepend_scheme \"", scheme, "\"");
        spec.add_dummy_prefix = scheme != "never";
      } else {
        spec.add_dummy_prefix = r.value("add_prefix_space", true);
      }
      spec.escape_whitespaces = true;
      metaspace = true;
      continue;
    }
    fail("tokenizer: '", name, "': pre_tokenizer ", r.dump().substr(0, 200),
         " has no SentencePiece equivalent (vidit reads Metaspace, after an optional WhitespaceSplit); pass the "
         "spiece.model instead");
  }
}

// The id of the special piece `piece`, or -1. A file that lists no special added tokens (as
// transformers' generic SentencePiece converter writes) still has SentencePiece's "</s>", "<pad>",
// "<s>" in its vocab: such a NORMAL piece is made CONTROL, as it is in the spiece.model.
int piece_id(Spec& spec, const std::string& piece) {
  for (size_t i = 0; i < spec.pieces.size(); ++i) {
    Piece& p = spec.pieces[i];
    if (p.piece != piece) continue;
    if (p.type == NORMAL && !spec.any_special_added) p.type = CONTROL;
    return p.type == CONTROL ? static_cast<int>(i) : -1;
  }
  return -1;
}

void read_special_ids(const json& root, const std::string& name, Spec& spec) {
  const json post = root.value("post_processor", json());
  if (!post.is_null()) {
    VIDIT_CHECK(str(post, "type") == "TemplateProcessing" && post.contains("single") && post["single"].is_array(),
                "tokenizer: '", name, "': post_processor ", post.dump().substr(0, 200),
                " is not the TemplateProcessing \"$A </s>\" of T5 / umT5; vidit appends only the end-of-sequence "
                "token");
    const json& single = post["single"];
    const bool shape = single.size() == 2 && single[0].contains("Sequence") && single[1].contains("SpecialToken");
    VIDIT_CHECK(shape, "tokenizer: '", name, "': post_processor.single is ", single.dump().substr(0, 200),
                ", not \"$A <eos>\" (the text, then one end-of-sequence token): vidit appends only that");
    const std::string token = str(single[1]["SpecialToken"], "id");
    const json specials = post.value("special_tokens", json::object());
    VIDIT_CHECK(specials.contains(token) && specials[token].contains("ids") && specials[token]["ids"].size() == 1,
                "tokenizer: '", name, "': post_processor.special_tokens lacks \"", token, "\" with one id");
    spec.eos_id = specials[token]["ids"][0].get<int>();
    piece_id(spec, token);  // CONTROL, in a file that lists no special tokens
    VIDIT_CHECK(spec.eos_id >= 0 && spec.eos_id < static_cast<int>(spec.pieces.size()) &&
                    spec.pieces[spec.eos_id].piece == token && spec.pieces[spec.eos_id].type == CONTROL,
                "tokenizer: '", name, "': the post_processor's end-of-sequence token \"", token, "\" (id ",
                spec.eos_id, ") is not a special added token at that id");
  } else {
    spec.eos_id = piece_id(spec, "</s>");
  }
  std::string pad = "<pad>";
  if (root.contains("padding") && root["padding"].is_object()) pad = str(root["padding"], "pad_token");
  spec.pad_id = piece_id(spec, pad);
  spec.bos_id = piece_id(spec, "<s>");
}

std::string serialize(const Spec& spec) {
  ProtoWriter model;
  for (const Piece& p : spec.pieces) {  // ModelProto.pieces = 1
    ProtoWriter piece;
    piece.bytes_field(1, p.piece);  // SentencePiece.piece = 1
    piece.float_field(2, p.score);  // score = 2
    piece.int_field(3, p.type);     // type = 3
    model.bytes_field(1, piece.bytes());
  }
  auto name_of = [&](int id, const char* fallback) { return id >= 0 ? spec.pieces[id].piece : std::string(fallback); };
  ProtoWriter trainer;  // TrainerSpec
  trainer.int_field(3, 1);  // model_type = 3: UNIGRAM
  trainer.int_field(4, static_cast<int64_t>(spec.pieces.size()));  // vocab_size = 4
  trainer.int_field(35, spec.byte_fallback);                      // byte_fallback = 35
  trainer.int_field(40, spec.unk_id);                             // unk_id = 40
  trainer.int_field(41, spec.bos_id);                             // bos_id = 41
  trainer.int_field(42, spec.eos_id);                             // eos_id = 42
  trainer.int_field(43, spec.pad_id);                             // pad_id = 43
  // The processor finds unk / bos / eos / pad by these names (unk_piece = 45 ... pad_piece = 48).
  trainer.bytes_field(45, name_of(spec.unk_id, "<unk>"));
  trainer.bytes_field(46, name_of(spec.bos_id, "<s>"));
  trainer.bytes_field(47, name_of(spec.eos_id, "</s>"));
  trainer.bytes_field(48, name_of(spec.pad_id, "<pad>"));
  model.bytes_field(2, trainer.bytes());  // ModelProto.trainer_spec = 2
  ProtoWriter normalizer;  // NormalizerSpec
  normalizer.bytes_field(1, spec.charsmap.empty() ? "identity" : "tokenizer.json");  // name = 1 (a label)
  if (!spec.charsmap.empty()) normalizer.bytes_field(2, spec.charsmap);                // precompiled_charsmap = 2
  normalizer.int_field(3, spec.add_dummy_prefix);           // add_dummy_prefix = 3
  normalizer.int_field(4, spec.remove_extra_whitespaces);   // remove_extra_whitespaces = 4
  normalizer.int_field(5, spec.escape_whitespaces);         // escape_whitespaces = 5
  model.bytes_field(3, normalizer.bytes());  // ModelProto.normalizer_spec = 3
  return model.bytes();
}

}  // namespace

bool is_tokenizer_json(const std::string& path) {
  return path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
}

std::string sentencepiece_model_from_tokenizer_json_text(const std::string& json_text, const std::string& name) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    fail("tokenizer: cannot parse '", name, "' as JSON (", e.what(), "): the file is damaged; download it again");
  }
  VIDIT_CHECK(root.is_object(), "tokenizer: '", name, "' is not a JSON object: not a Hugging Face tokenizer.json");
  try {
    Spec spec;
    read_model(root, name, spec);
    read_added_tokens(root, name, spec);
    read_normalizer(root, name, spec);
    read_pre_tokenizer(root, name, spec);
    read_special_ids(root, name, spec);
    return serialize(spec);
  } catch (const json::exception& e) {  // a value of an unexpected type
    fail("tokenizer: '", name, "' has a value of an unexpected type (", e.what(), ")");
  }
}

std::string sentencepiece_model_from_tokenizer_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VIDIT_CHECK(in, "tokenizer: cannot open '", path, "'");
  std::stringstream text;
  text << in.rdbuf();
  return sentencepiece_model_from_tokenizer_json_text(text.str(), path);
}

}  // namespace vidit::text

// Hugging Face's tokenizer.json, when it describes a SentencePiece unigram model (as transformers
// writes it for T5 / umT5), turned back into that SentencePiece model: the serialized ModelProto
// that sentencepiece::SentencePieceProcessor::LoadFromSerializedProto reads. The ids then come from
// the SentencePiece library itself, as they do for spiece.model.
//
// What is translated (everything else is refused with an error naming the file and the key):
//   model        "Unigram": vocab [[piece, score], ...] in id order, unk_id (the UNKNOWN piece),
//                byte_fallback (then <0x00>..<0xFF> are BYTE pieces).
//   added_tokens special ones -> CONTROL pieces (never produced from text: "</s>" in a caption is
//                text, as SentencePiece does), others -> USER_DEFINED (always one piece). An added
//                token must be the vocab entry at its id, or the next id after the vocab.
//   normalizer   "Precompiled" (the charsmap, base64) first, then any of the whitespace rules the
//                converters write: Strip, Replace(" {2,}" -> " " or "▁"), Replace("\A +| +\z" -> ""),
//                Replace(" " -> "▁"), Replace("\A▁" -> "▁▁"); in a "Sequence" or alone, or none.
//                A whitespace folding rule (or a WhitespaceSplit pre-tokenizer) sets
//                remove_extra_whitespaces; SentencePiece then folds runs of spaces and drops leading
//                and trailing ones, which for a model whose pieces hold no inner "▁" gives the same
//                ids as the tokenizers library on all text we test (tokenizer_json_test.cpp).
//   pre_tokenizer "Metaspace" (replacement "▁"; prepend_scheme always / first / never, or the older
//                add_prefix_space) -> add_dummy_prefix; "WhitespaceSplit" before it; or none.
//   post_processor a TemplateProcessing "$A </s>" (or none): its special token is the EOS piece.
// The pad piece is padding.pad_token, else "<pad>"; the bos piece "<s>" when present. A file with no
// special added tokens (transformers' generic converter) has its "</s>", "<pad>", "<s>" made CONTROL.
//
// Known difference from the tokenizers library (vidit gives SentencePiece's ids): T5's tokenizer.json
// splits words at every Unicode whitespace character (WhitespaceSplit), SentencePiece only at the
// spaces its charsmap makes; with umT5's charsmap that differs only for U+0085 (NEXT LINE). Wan's
// caption cleaning folds U+0085 to a space first, so captions are not affected.
#pragma once
#include <string>

namespace vidit::text {

// The serialized SentencePiece ModelProto that the tokenizer.json file at `path` describes. Throws
// vidit::Error naming `path` (and the key) when it cannot be read, is not JSON, or holds a model or
// rule SentencePiece cannot express.
std::string sentencepiece_model_from_tokenizer_json(const std::string& path);

// The same from the file's text; `name` (the file) is what the errors say.
std::string sentencepiece_model_from_tokenizer_json_text(const std::string& json_text, const std::string& name);

// True when `path` names a tokenizer.json (by its extension: ".json").
bool is_tokenizer_json(const std::string& path);

}  // namespace vidit::text

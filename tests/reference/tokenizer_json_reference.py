#!/usr/bin/env python3
"""Reference outputs for vidit's tokenizer.json reader (src/text/tokenizer_json_test.cpp).

Trains small SentencePiece unigram models, converts each to tokenizer.json with transformers' own
converters, and records for a varied set of strings the ids of the SentencePiece Python package
(spiece.model) and of the tokenizers library (tokenizer.json). Writes into OUT, per variant V:
  V/spiece.model, V/tokenizer.json (+ the other files save_pretrained writes)
  cases.json   {variant: {"eos_id", "pad_id", "pieces", "cases": [{"text", "spm", "hf", "hf_full",
                "spm_bytes"}]}}: spm = sp.encode(text); hf = encode(text, add_special_tokens=False);
                hf_full = encode(text) (the post-processor's </s> appended); spm_bytes: spm used byte pieces
Variants:
  umt5        umT5's settings (pad 0, eos 1, unk 2, byte fallback, nmt_nfkc), converted as transformers
              converts umT5 (T5Tokenizer, 3 extra ids): its tokenizer.json has byte_fallback false
  umt5_bytes  the same tokenizer.json with model.byte_fallback true
  generic     identity normalization, no whitespace folding, no dummy prefix, no byte fallback,
              converted by SpmConverter.build_tokenizer_from_spm_proto (follows the model's settings)
  generic_nfkc nmt_nfkc, whitespace folding and dummy prefix, same converter (legacy Replace rules)
Exit status 3 (with the reason on stdout) when a needed Python package is missing.
"""
import argparse
import json
import os
import random
import shutil
import sys

try:
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as model_pb2
    from tokenizers import Tokenizer
    from transformers import T5Tokenizer
    from transformers.convert_slow_tokenizer import SpmConverter
except ImportError as e:  # the C++ tests skip, naming this
    print(f"missing Python package: {e}")
    sys.exit(3)

WORDS = ("a cat walks slowly across the wooden floor while sunlight falls through the window camera pans "
         "left drone shot of mountains at dawn le chat noir été café crème brûlée à côté déjà château "
         "die große Straße über der Brücke Größe Äpfel Öl el niño mañana 一只猫 在 木地板 上 慢慢 走过 "
         "阳光 猫 が ゆっくり 歩く 東京 の 夜景 고양이 가 천천히 кошка медленно идёт قطة تمشي "
         "🐱 🌅 🎥 ✨ 👩‍🚀").split()

TEXTS = [
    "A cat walks slowly across the wooden floor.",
    "Le chat noir marche à côté du château, déjà l'été.",
    "一只猫在木地板上慢慢走过，阳光透过窗户。",
    "東京の夜景 カメラ 🎥 ✨",
    "emoji only 🐱🌅👩‍🚀 and a rare one 🦩",
    "  leading and trailing   spaces\tand\ttabs\n\nand newlines  ",
    "non\u00a0breaking\u3000ideographic\u2003em space\u2028line separator\u000bvertical tab",
    "Straße über die Brücke, Größe, Äpfel und Öl. Ｆｕｌｌｗｉｄｔｈ ＡＢＣ ① ﬁ ™",
    "кошка медленно идёт по деревянному полу",
    "قطة تمشي ببطء على الأرض",
    "unseen script: ᚠᛇᚻ᛫ᛒᛦᚦ and Ωμέγα and ∑∫√",
    "zero\u200bwidth and combining e\u0301 and a\r\nwindows line",
    " ".join(["long caption that goes on and on"] * 12),
    "x",
    # Text already holding "\u2581" (agrees); U+0085, which T5's WhitespaceSplit splits at but the
    # charsmap keeps: there tokenizer.json and spiece.model disagree, and vidit gives SentencePiece's ids.
    "\u2581pre-escaped \u2581words",
    "next\u0085line",
    "",
    "   ",
]


def train(out_dir, **kw):
    os.makedirs(out_dir, exist_ok=True)
    corpus = os.path.join(out_dir, "corpus.txt")
    rng = random.Random(0)
    with open(corpus, "w", encoding="utf-8") as f:
        for _ in range(2000):
            f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + "\n")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=os.path.join(out_dir, "spiece"), model_type="unigram", vocab_size=500,
        character_coverage=0.98, hard_vocab_limit=False, minloglevel=2, num_threads=1, **kw)
    os.remove(corpus)
    return os.path.join(out_dir, "spiece.model")


def record(model_file, json_file):
    sp = spm.SentencePieceProcessor(model_file=model_file)
    tk = Tokenizer.from_file(json_file)
    cases = []
    for text in TEXTS:
        ids = sp.encode(text)
        cases.append({"text": text, "spm": ids, "hf": tk.encode(text, add_special_tokens=False).ids,
                      "hf_full": tk.encode(text).ids, "spm_bytes": any(sp.is_byte(i) for i in ids)})
    return {"eos_id": sp.eos_id(), "pad_id": sp.pad_id(), "pieces": sp.get_piece_size(), "cases": cases}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = ap.parse_args().out
    os.makedirs(out, exist_ok=True)
    result = {}

    d = os.path.join(out, "umt5")
    model = train(d, byte_fallback=True, pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    T5Tokenizer.from_pretrained(d, extra_ids=3).save_pretrained(d)
    result["umt5"] = record(model, os.path.join(d, "tokenizer.json"))

    b = os.path.join(out, "umt5_bytes")
    os.makedirs(b, exist_ok=True)
    shutil.copy(model, os.path.join(b, "spiece.model"))
    with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    j["model"]["byte_fallback"] = True
    with open(os.path.join(b, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    result["umt5_bytes"] = record(model, os.path.join(b, "tokenizer.json"))

    for name, kw in (("generic", dict(normalization_rule_name="identity", remove_extra_whitespaces=False,
                                      add_dummy_prefix=False)),
                     ("generic_nfkc", dict())):
        g = os.path.join(out, name)
        model = train(g, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, **kw)
        proto = model_pb2.ModelProto()
        with open(model, "rb") as f:
            proto.ParseFromString(f.read())
        vocab = [(p.piece, p.score) for p in proto.pieces]
        SpmConverter.build_tokenizer_from_spm_proto(proto, vocab).save(os.path.join(g, "tokenizer.json"))
        result[name] = record(model, os.path.join(g, "tokenizer.json"))

    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(result, f, ensure_ascii=True, indent=1)
    print("ok")


if __name__ == "__main__":
    main()

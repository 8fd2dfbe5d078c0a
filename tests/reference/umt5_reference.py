#!/usr/bin/env python3
"""Reference outputs for vidit's umT5 tokenizer and encoder (src/text/*_test.cpp).

Writes into OUT:
  spm/spiece.model        a small SentencePiece unigram model (byte fallback) trained on a varied corpus
  tokens.json             captions and the ids Wan's convention gives with the SentencePiece Python
                          package: prompt_clean without ftfy, ids, EOS, truncation, padding
  small/                  UMT5EncoderModel (random weights, small config) via save_pretrained
  small_sharded/          the same model saved in several shards (model.safetensors.index.json)
  small_wan/              the same weights under Wan's T5Encoder key names (+ config.json)
  small_wan_pth/          the same, torch.save'd (as Wan ships models_t5_umt5-xxl-enc-bf16.pth)
  pipe/{text_encoder,tokenizer}  a diffusers-style pipeline folder of the small model
  small_io.safetensors    ids, mask and transformers' last_hidden_state for them; the captions of
                          tokens.json run through the model at text_len, padding zeroed ("context")
  xxl/, xxl_io.safetensors  the same for umT5-XXL's layer shape (1 layer, small vocab)
Exit status 3 (with the reason on stdout) when a needed Python package is missing.
"""
import argparse
import html
import json
import os
import random
import re
import shutil
import sys

try:
    import torch
    import sentencepiece as spm
    from safetensors.torch import save_file
    from transformers import UMT5Config, UMT5EncoderModel
except ImportError as e:  # the C++ tests skip, naming this
    print(f"missing Python package: {e}")
    sys.exit(3)


def prompt_clean(text):
    """Wan / diffusers' prompt_clean without ftfy (C++ has none)."""
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


WORDS = {
    "en": "a cat walks slowly across the wooden floor while sunlight falls through the window onto "
          "red green blue flowers camera pans left drone shot of mountains at dawn ocean waves crash "
          "city street night neon lights rain reflections close up portrait smiling woman old man".split(),
    "fr": "le chat noir marche lentement sur le plancher été café crème brûlée à côté déjà "
          "forêt château élève naïve garçon".split(),
    "de": "die große Straße über der Brücke schöne Mädchen Größe Fußball Äpfel Öl".split(),
    "es": "el niño pequeño mañana señor corazón canción árbol".split(),
    "zh": "一只猫 在 木地板 上 慢慢 走过 阳光 透过 窗户 城市 夜晚 霓虹灯 雨 山脉 黎明".split(),
    "ja": "猫 が ゆっくり 歩く 桜 の 花 東京 の 夜景 カメラ".split(),
    "ko": "고양이 가 천천히 걷는다 서울 밤 풍경".split(),
    "ru": "кошка медленно идёт по деревянному полу солнечный свет".split(),
    "ar": "قطة تمشي ببطء على الأرض".split(),
    "emoji": "🐱 🌅 🎥 ✨ 🚗 🌧️ 👩‍🚀".split(),
}


def write_corpus(path, lines=3000, seed=0):
    rng = random.Random(seed)
    langs = list(WORDS)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(lines):
            lang = rng.choice(langs)
            words = [rng.choice(WORDS[lang]) for _ in range(rng.randint(3, 14))]
            if rng.random() < 0.3:
                words.append(rng.choice(WORDS["emoji"]))
            if rng.random() < 0.2:
                words.append(str(rng.randint(0, 2025)))
            sep = "" if lang in ("zh", "ja") and rng.random() < 0.5 else " "
            f.write(sep.join(words) + ("." if rng.random() < 0.5 else "") + "\n")


def train_spm(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    corpus = os.path.join(out_dir, "corpus.txt")
    write_corpus(corpus)
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=os.path.join(out_dir, "spiece"), model_type="unigram", vocab_size=700,
        byte_fallback=True, character_coverage=0.98, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        hard_vocab_limit=False, minloglevel=2, num_threads=1)
    return spm.SentencePieceProcessor(model_file=os.path.join(out_dir, "spiece.model"))


CAPTIONS = [
    "A cat walks slowly across the wooden floor.",
    "Le chat noir marche à côté du château, déjà l'été.",
    "一只猫在木地板上慢慢走过，阳光透过窗户。",
    "東京の夜景 カメラ 🎥 ✨",
    "emoji only 🐱🌅👩‍🚀 and a rare one 🦩",
    "  leading and trailing   spaces\tand\ttabs\n\nand newlines  ",
    "non\u00a0breaking\u3000ideographic\u2003em space",
    "html &amp; entities: &lt;b&gt; caf&eacute; &#233; &#x1F600; &amp;amp; &notit; &copy &#128; &#0;",
    "Straße über die Brücke, Größe, Äpfel und Öl",
    "кошка медленно идёт по деревянному полу",
    "قطة تمشي ببطء على الأرض",
    "unseen script: ᚠᛇᚻ᛫ᛒᛦᚦ and Ωμέγα and ∑∫√",
    " ".join(["long caption that goes on and on"] * 12),
    "",
    "   ",
]


def tokenize(sp, captions, text_len):
    eos, pad = sp.eos_id(), max(sp.pad_id(), 0)
    cases = []
    for text in captions:
        ids = sp.encode(prompt_clean(text))
        truncated = len(ids) + 1 > text_len
        ids = ids[: text_len - 1] if truncated else ids
        ids = ids + [eos]
        n = len(ids)
        cases.append({"text": text, "ids": ids + [pad] * (text_len - n), "length": n, "truncated": truncated})
    return cases


def hf_tokenizer_check(spm_file, cases, text_len):
    """How Hugging Face's T5 tokenizer tokenizes the same (cleaned) captions: recorded, not asserted."""
    try:
        from transformers import T5Tokenizer
        tok = T5Tokenizer.from_pretrained(os.path.dirname(spm_file), extra_ids=0)
        out = []
        for c in cases:
            enc = tok(prompt_clean(c["text"]), padding="max_length", max_length=text_len, truncation=True,
                      add_special_tokens=True)
            out.append(enc["input_ids"])
        return out
    except Exception as e:  # informational only
        return str(e)


def make_model(cfg_kwargs, seed):
    torch.manual_seed(seed)
    cfg = UMT5Config(**cfg_kwargs)
    try:
        model = UMT5EncoderModel(cfg, attn_implementation="eager")
    except TypeError:
        cfg._attn_implementation = "eager"
        model = UMT5EncoderModel(cfg)
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.uniform_(0.5, 1.5)  # not all ones, so a norm weight that is ignored shows
            elif "relative_attention_bias" in name:
                p.normal_(0.0, 0.5)  # large enough that a wrong bucket shows
    return model


def wan_state_dict(model):
    """UMT5EncoderModel's weights under Wan's T5Encoder names."""
    sd = model.state_dict()
    out = {"token_embedding.weight": sd["shared.weight"], "norm.weight": sd["encoder.final_layer_norm.weight"]}
    names = {"layer.0.SelfAttention.q.weight": "attn.q.weight", "layer.0.SelfAttention.k.weight": "attn.k.weight",
             "layer.0.SelfAttention.v.weight": "attn.v.weight", "layer.0.SelfAttention.o.weight": "attn.o.weight",
             "layer.0.SelfAttention.relative_attention_bias.weight": "pos_embedding.embedding.weight",
             "layer.0.layer_norm.weight": "norm1.weight", "layer.1.layer_norm.weight": "norm2.weight",
             "layer.1.DenseReluDense.wi_0.weight": "ffn.gate.0.weight",
             "layer.1.DenseReluDense.wi_1.weight": "ffn.fc1.weight",
             "layer.1.DenseReluDense.wo.weight": "ffn.fc2.weight"}
    for key, t in sd.items():
        m = re.match(r"encoder\.block\.(\d+)\.(.+)$", key)
        if m and m.group(2) in names:
            out[f"blocks.{m.group(1)}.{names[m.group(2)]}"] = t.contiguous().clone()
    return out


def random_ids(vocab, B, L, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (B, L), generator=g)
    mask = torch.zeros(B, L, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, n - 1] = 1
        ids[b, n:] = 0
        mask[b, :n] = 1
    return ids, mask


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--text-len", type=int, default=16)
    ap.add_argument("--no-xxl", action="store_true")
    args = ap.parse_args()
    out = args.out
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    sp = train_spm(os.path.join(out, "spm"))
    cases = tokenize(sp, CAPTIONS, args.text_len)
    hf = hf_tokenizer_check(os.path.join(out, "spm", "spiece.model"), cases, args.text_len)
    with open(os.path.join(out, "tokens.json"), "w") as f:
        json.dump({"text_len": args.text_len, "vocab_size": sp.get_piece_size(), "eos_id": sp.eos_id(),
                   "cases": cases, "hf_ids": hf}, f, ensure_ascii=True, indent=1)
    vocab = sp.get_piece_size()

    small_cfg = dict(vocab_size=vocab, d_model=64, d_kv=16, d_ff=96, num_heads=4, num_layers=2,
                     relative_attention_num_buckets=32, relative_attention_max_distance=20,
                     layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu", dropout_rate=0.0)
    model = make_model(small_cfg, seed=1)
    model.save_pretrained(os.path.join(out, "small"), safe_serialization=True)
    model.save_pretrained(os.path.join(out, "small_sharded"), safe_serialization=True, max_shard_size="100KB")
    # Wan's file names, each in a folder with the config.json that gives the shape the tensors cannot
    # tell (max_distance); Wan's own files need none (umT5-XXL's values are the defaults).
    for folder, name in (("small_wan", "models_t5.safetensors"), ("small_wan_pth", "models_t5.pth")):
        os.makedirs(os.path.join(out, folder), exist_ok=True)
        shutil.copy(os.path.join(out, "small", "config.json"), os.path.join(out, folder, "config.json"))
        if name.endswith(".pth"):
            torch.save(wan_state_dict(model), os.path.join(out, folder, name))
        else:
            save_file(wan_state_dict(model), os.path.join(out, folder, name))
    pipe = os.path.join(out, "pipe")
    shutil.copytree(os.path.join(out, "small"), os.path.join(pipe, "text_encoder"), dirs_exist_ok=True)
    os.makedirs(os.path.join(pipe, "tokenizer"), exist_ok=True)
    shutil.copy(os.path.join(out, "spm", "spiece.model"), os.path.join(pipe, "tokenizer", "spiece.model"))

    # Long enough (48 > max_distance 20) to reach the log-spaced and the clamped buckets.
    ids, mask = random_ids(vocab, 3, 48, [48, 30, 5], seed=2)
    cap_ids = torch.tensor([c["ids"] for c in cases], dtype=torch.long)
    cap_mask = (torch.arange(args.text_len)[None, :] < torch.tensor([c["length"] for c in cases])[:, None]).long()
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        context = model(input_ids=cap_ids, attention_mask=cap_mask).last_hidden_state * cap_mask[..., None]
    save_file({"ids": ids, "mask": mask, "hidden": hidden.contiguous(), "caption_ids": cap_ids,
               "caption_mask": cap_mask, "context": context.contiguous()}, os.path.join(out, "small_io.safetensors"))

    if not args.no_xxl:
        xxl_cfg = dict(vocab_size=vocab, d_model=4096, d_kv=64, d_ff=10240, num_heads=64, num_layers=1,
                       relative_attention_num_buckets=32, relative_attention_max_distance=128,
                       layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu", dropout_rate=0.0)
        model = make_model(xxl_cfg, seed=3)
        model.save_pretrained(os.path.join(out, "xxl"), safe_serialization=True)
        ids, mask = random_ids(vocab, 2, 12, [12, 7], seed=4)
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        save_file({"ids": ids, "mask": mask, "hidden": hidden.contiguous()}, os.path.join(out, "xxl_io.safetensors"))
    print("ok")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# vidit's umT5 encoder against transformers' eager UMT5EncoderModel, fp32 on the CPU, same random
# weights (umT5-XXL's layer shape: d_model 4096, d_ff 10240, 64 heads), same token ids, same
# number of threads. Two figures:
#   forward: both run the encoder on the same padded [B, TEXT_LEN] batch (kernel against kernel);
#   captions: transformers as diffusers' WanPipeline runs it (every caption padded to TEXT_LEN,
#             then the padding zeroed) against vidit's TextEncoder (the batch cut to its longest
#             caption, only real tokens' rows computed, zeros on padding): the same
#             [B, TEXT_LEN, 4096] context comes out.
# Prints C++/transformers ratios of wall-clock time (the figure; goal <= 0.8) and of process CPU
# time (both threads; less disturbed when other processes share the cores).
#   bench/bench_text_encoder.sh [BUILD_DIR]   env: LAYERS=1 BATCH=2 TEXT_LEN=512 LENGTHS=120,60 THREADS=2 REPS=3
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
PY=${PYTHON:-$ROOT/.venv/bin/python}
LAYERS=${LAYERS:-1} BATCH=${BATCH:-2} TEXT_LEN=${TEXT_LEN:-512} LENGTHS=${LENGTHS:-120,60}
THREADS=${THREADS:-2} REPS=${REPS:-3}
WORK=$(mktemp -d /tmp/vidit_bench_text.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

"$PY" - "$WORK" "$LAYERS" "$BATCH" "$TEXT_LEN" "$LENGTHS" "$THREADS" "$REPS" <<'PYEOF' | tee "$WORK/py.txt"
import statistics, sys, time
import torch
from safetensors.torch import save_file
from transformers import UMT5Config, UMT5EncoderModel

work, layers, batch, text_len, lengths, threads, reps = sys.argv[1:]
layers, batch, text_len, threads, reps = int(layers), int(batch), int(text_len), int(threads), int(reps)
lengths = [int(x) for x in lengths.split(",")]
lengths = (lengths * batch)[:batch]
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = UMT5Config(vocab_size=1000, d_model=4096, d_kv=64, d_ff=10240, num_heads=64, num_layers=layers,
                 relative_attention_num_buckets=32, relative_attention_max_distance=128,
                 feed_forward_proj="gated-gelu", dropout_rate=0.0)
try:
    model = UMT5EncoderModel(cfg, attn_implementation="eager").eval()
except TypeError:
    cfg._attn_implementation = "eager"
    model = UMT5EncoderModel(cfg).eval()
model.save_pretrained(f"{work}/model", safe_serialization=True)
ids = torch.randint(3, 1000, (batch, text_len))
mask = torch.zeros(batch, text_len, dtype=torch.long)
for b, n in enumerate(lengths):
    ids[b, n - 1] = 1
    ids[b, n:] = 0
    mask[b, :n] = 1
save_file({"ids": ids, "mask": mask}, f"{work}/io.safetensors")

def median_ms(f):  # median wall-clock and process CPU (all threads) milliseconds
    f()
    wall, cpu = [], []
    for _ in range(reps):
        a, c = time.perf_counter(), time.process_time()
        f()
        cpu.append((time.process_time() - c) * 1e3)
        wall.append((time.perf_counter() - a) * 1e3)
    return statistics.median(wall), statistics.median(cpu)

with torch.inference_mode():
    padded, padded_cpu = median_ms(lambda: model(input_ids=ids, attention_mask=mask).last_hidden_state * mask[..., None])
print(f"transformers {__import__('transformers').__version__} torch {torch.__version__} padded_ms {padded:.1f} "
      f"padded_cpu_ms {padded_cpu:.1f} threads {torch.get_num_threads()}")
PYEOF

"$BUILD/bench_text_encoder" --model "$WORK/model" --io "$WORK/io.safetensors" --threads "$THREADS" --reps "$REPS" \
  | tee "$WORK/cpp.txt"

python3 - "$WORK/py.txt" "$WORK/cpp.txt" <<'PYEOF'
import re, sys
py = open(sys.argv[1]).read()
cpp = open(sys.argv[2]).read()
get = lambda text, key: float(re.search(key + r" ([\d.]+)", text).group(1))
for unit, sfx in (("wall", "ms"), ("cpu", "cpu_ms")):
    hf, padded, trimmed = get(py, "padded_" + sfx), get(cpp, "padded_" + sfx), get(cpp, "trimmed_" + sfx)
    print(f"forward  (same padded batch), {unit}: C++ {padded:9.1f} ms  transformers {hf:9.1f} ms  "
          f"ratio C++/transformers {padded / hf:.3f}")
    print(f"captions (Wan context out),   {unit}: C++ {trimmed:9.1f} ms  transformers {hf:9.1f} ms  "
          f"ratio C++/transformers {trimmed / hf:.3f}")
PYEOF

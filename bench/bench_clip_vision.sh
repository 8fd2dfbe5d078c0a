#!/usr/bin/env bash
# vidit's CLIP image encoder against transformers' eager CLIPVisionModel, fp32 on the CPU, same
# random weights (ViT-H/14's shape: hidden 1280, 16 heads, MLP 5120, patch 14, 224 pixels;
# LAYERS of its 32), the same pixel values, the same number of threads. Two figures:
#   forward:     both run every layer (transformers with output_hidden_states, as diffusers'
#                WanImageToVideoPipeline asks it, then takes hidden_states[-2]);
#   penultimate: vidit's penultimate(), which stops before the last layer (what Wan needs),
#                against the same transformers call.
# Prints C++/transformers ratios of wall-clock time (the figure; goal <= 0.8) and of process CPU
# time (both threads; less disturbed when other processes share the cores).
# DTYPE=bf16 runs both in bf16 (transformers' model cast with .to(torch.bfloat16), its pixels
# too; vidit's weights and projections in bf16, its residual stream fp32).
#   bench/bench_clip_vision.sh [BUILD_DIR]   env: LAYERS=4 BATCH=1 THREADS=2 REPS=3 DTYPE=fp32
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
PY=${PYTHON:-$ROOT/.venv/bin/python}
LAYERS=${LAYERS:-4} BATCH=${BATCH:-1} THREADS=${THREADS:-2} REPS=${REPS:-3} DTYPE=${DTYPE:-fp32}
WORK=$(mktemp -d /tmp/vidit_bench_clip.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

"$PY" - "$WORK" "$LAYERS" "$BATCH" "$THREADS" "$REPS" "$DTYPE" <<'PYEOF' | tee "$WORK/py.txt"
import statistics, sys, time
import torch
from safetensors.torch import save_file
from transformers import CLIPVisionConfig, CLIPVisionModel

work, layers, batch, threads, reps, dtype = sys.argv[1:]
layers, batch, threads, reps = int(layers), int(batch), int(threads), int(reps)
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = CLIPVisionConfig(hidden_size=1280, intermediate_size=5120, num_hidden_layers=layers, num_attention_heads=16,
                       patch_size=14, image_size=224, hidden_act="gelu", layer_norm_eps=1e-5)
try:
    model = CLIPVisionModel(cfg, attn_implementation="eager").eval()
except TypeError:
    cfg._attn_implementation = "eager"
    model = CLIPVisionModel(cfg).eval()
model.save_pretrained(f"{work}/model", safe_serialization=True)
pixels = torch.randn(batch, 3, 224, 224)
save_file({"pixel_values": pixels}, f"{work}/io.safetensors")

def median_ms(f):  # median wall-clock and process CPU (all threads) milliseconds
    f()
    wall, cpu = [], []
    for _ in range(reps):
        a, c = time.perf_counter(), time.process_time()
        f()
        cpu.append((time.process_time() - c) * 1e3)
        wall.append((time.perf_counter() - a) * 1e3)
    return statistics.median(wall), statistics.median(cpu)

if dtype == "bf16":  # cast after saving: both sides read the same fp32 file
    model, pixels = model.to(torch.bfloat16), pixels.to(torch.bfloat16)
with torch.inference_mode():
    ms, cpu_ms = median_ms(lambda: model(pixel_values=pixels, output_hidden_states=True).hidden_states[-2])
print(f"transformers {__import__('transformers').__version__} torch {torch.__version__} forward_ms {ms:.1f} "
      f"forward_cpu_ms {cpu_ms:.1f} threads {torch.get_num_threads()}")
PYEOF

"$BUILD/bench_clip_vision" --model "$WORK/model" --io "$WORK/io.safetensors" --threads "$THREADS" --reps "$REPS" --dtype "$DTYPE" \
  | tee "$WORK/cpp.txt"

python3 - "$WORK/py.txt" "$WORK/cpp.txt" <<'PYEOF'
import re, sys
py = open(sys.argv[1]).read()
cpp = open(sys.argv[2]).read()
get = lambda text, key: float(re.search(key + r" ([\d.]+)", text).group(1))
for unit, sfx in (("wall", "ms"), ("cpu", "cpu_ms")):
    hf = get(py, "forward_" + sfx)
    for what in ("forward", "penultimate"):
        ours = get(cpp, what + "_" + sfx)
        print(f"{what:11s} {unit}: C++ {ours:9.1f} ms  transformers {hf:9.1f} ms  ratio C++/transformers {ours / hf:.3f}")
PYEOF

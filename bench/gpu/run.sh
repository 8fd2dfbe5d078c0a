#!/usr/bin/env bash
# The one script for the GPU test machine (one H200, CUDA 13, a Python with a CUDA torch, cmake,
# ninja, no network). Builds vidit against that torch with the CUDA kernels, runs every GPU test
# and the train-step benchmark, and prints a short table last. Keeps to ~8 minutes of wall time
# (VIDIT_GPU_BUDGET_S, default 470 s): each step gets what is left of that budget.
#
# Header-only / small dependencies the machine may lack (toml++, CLI11, nlohmann-json,
# GoogleTest, libpng) are taken from third_party/debs when present; make that folder on a machine
# with network with scripts/fetch_header_deps.sh before copying the tree over.
#
# Usage: bench/gpu/run.sh            env: PYTHON, VIDIT_GPU_BUDGET_S, BUILD_DIR (build-gpu), JOBS (16)
# Logs go to $BUILD_DIR/gpu_logs/ and, when $OUT is set, are copied to $OUT/ as well.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
BUILD=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-16}
BUDGET=${VIDIT_GPU_BUDGET_S:-470}
DEADLINE=$((SECONDS + BUDGET))
LOGS="$BUILD/gpu_logs"
mkdir -p "$LOGS"

left() { echo $((DEADLINE - SECONDS)); }
# cap N: the smaller of N and the time left (at least 5 s so the step can report).
cap() { local l; l=$(left); ((l < $1)) && echo $((l > 5 ? l : 5)) || echo "$1"; }
say() { echo "[gpu-run $(date +%H:%M:%S) +${SECONDS}s] $*"; }

declare -A STATUS DETAIL
export_logs() {
  if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then cp -f "$LOGS"/*.log "$LOGS"/*.gz "$OUT"/ 2>/dev/null || true; fi
}

summary() {
  echo
  echo "================ vidit GPU run summary ================"
  printf '%-14s %-8s %s\n' step status detail
  for step in environment configure build tests kernel_error kernels bench fp8 step_time lora samples profile; do
    printf '%-14s %-8s %s\n' "$step" "${STATUS[$step]:--}" "${DETAIL[$step]:-}"
  done
  echo "total wall: ${SECONDS}s (budget ${BUDGET}s); logs: $LOGS"
  echo "========================================================"
  export_logs
}

# ---- environment --------------------------------------------------------------------------
PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  for cand in python3 python; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import torch' 2>/dev/null; then PY=$(command -v "$cand"); break; fi
  done
fi
if [[ -z "$PY" ]]; then
  STATUS[environment]=FAIL; DETAIL[environment]="no python with torch (set PYTHON=...)"
  summary; exit 1
fi
TORCH_INFO=$("$PY" -c 'import torch;print(torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' 2>&1 | tail -n 1)
say "python $PY: torch $TORCH_INFO"
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13*/bin; do
    if [[ -x "$d/nvcc" ]]; then export PATH="$d:$PATH"; break; fi
  done
fi
NVCC=$(command -v nvcc || true)
GPU=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
say "nvcc: ${NVCC:-none} $([[ -n "$NVCC" ]] && nvcc --version | grep -o 'release [0-9.]*')"
say "gpu: ${GPU:-nvidia-smi unavailable}"
STATUS[environment]=ok
DETAIL[environment]="torch $TORCH_INFO; ${GPU:-no nvidia-smi}"
if [[ -z "$NVCC" ]]; then
  STATUS[environment]=FAIL; DETAIL[environment]+="; nvcc not found"
  summary; exit 1
fi
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}  # torch's cmake: no GPU probing, one arch
# torch's FindCUDA takes the toolkit from the first nvcc on PATH; a wrapper script there (not in
# the toolkit's bin/) would point it elsewhere: name the toolkit that nvcc belongs to.
CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
[[ -f "$CUDA_ROOT/include/cuda_runtime.h" ]] || CUDA_ROOT=$("$NVCC" -v -x cu /dev/null -E 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)
[[ -n "$CUDA_ROOT" && -f "$CUDA_ROOT/include/cuda_runtime.h" ]] || CUDA_ROOT=/usr/local/cuda
export CUDA_PATH="$CUDA_ROOT" CUDA_TOOLKIT_ROOT_DIR="$CUDA_ROOT"
say "CUDA toolkit: $CUDA_ROOT"

# ---- dependencies: system, else third_party/debs ------------------------------------------
DEBS="$ROOT/third_party/debs"
CMAKE_DIRS=(/usr/lib/x86_64-linux-gnu/cmake /usr/lib/cmake /usr/lib64/cmake /usr/share/cmake
            /usr/local/lib/cmake /usr/local/lib/x86_64-linux-gnu/cmake /usr/local/share/cmake)
has_cmake_pkg() {
  local d
  for d in "${CMAKE_DIRS[@]}"; do
    [[ -d "$d" ]] || continue
    if find "$d" -maxdepth 2 \( -iname "$1Config.cmake" -o -iname "$1-config.cmake" \) 2>/dev/null | grep -q .; then
      return 0
    fi
  done
  return 1
}
missing=()
for p in tomlplusplus CLI11 nlohmann_json GTest; do has_cmake_pkg "$p" || missing+=("$p"); done
[[ -f /usr/include/png.h || -f /usr/local/include/png.h ]] || missing+=(libpng)
command -v pkg-config >/dev/null || command -v pkgconf >/dev/null ||
  say "WARNING: pkg-config not found; CMakeLists' find_package(PkgConfig REQUIRED) will fail"
debs_args=()
use_debs() {
  local u="$DEBS/usr"
  debs_args=("-DCMAKE_PREFIX_PATH=$u;$u/lib/x86_64-linux-gnu/cmake;$u/share/cmake")
  export LD_LIBRARY_PATH="$u/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  say "using unpacked Debian packages from $DEBS"
}
if ((${#missing[@]})); then
  say "not found on this machine: ${missing[*]}"
  if [[ -d "$DEBS/usr" ]]; then
    use_debs
  else
    say "WARNING: no $DEBS (run scripts/fetch_header_deps.sh where there is network); configure may fail"
  fi
fi

# ---- configure ----------------------------------------------------------------------------
configure() {
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  [[ -f "$BUILD/CMakeCache.txt" ]] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${gen[1]:-Unix Makefiles}" "$BUILD/CMakeCache.txt" &&
    rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
  timeout "$(cap 180)" cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DVIDIT_FFMPEG=AUTO -DVIDIT_CUDA=ON -DPython3_EXECUTABLE="$PY" \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DCUDAToolkit_ROOT="$CUDA_ROOT" -DCUDA_TOOLKIT_ROOT_DIR="$CUDA_ROOT" \
    "${debs_args[@]}" >"$LOGS/configure.log" 2>&1
}
say "configure -> $LOGS/configure.log"
t0=$SECONDS
configure; rc=$?
if ((rc != 0)) && ((${#debs_args[@]} == 0)) && [[ -d "$DEBS/usr" ]]; then
  say "configure failed (rc $rc); retrying with $DEBS"
  use_debs
  rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
  configure; rc=$?
fi
if ((rc != 0)); then
  tail -n 30 "$LOGS/configure.log"
  STATUS[configure]=FAIL; DETAIL[configure]="rc $rc after $((SECONDS - t0))s (see configure.log)"
  summary; exit 1
fi
STATUS[configure]=ok
DETAIL[configure]="$((SECONDS - t0))s; $(grep -E 'vidit: (CUDA kernels|FFmpeg decode|LibTorch)' "$LOGS/configure.log" | sed 's/^-- vidit: //' | paste -sd ',' - | sed 's/,/, /g')"
grep -E 'vidit:' "$LOGS/configure.log" | sed 's/^/    /'

# ---- build --------------------------------------------------------------------------------
say "build (-j$JOBS) -> $LOGS/build.log"
t0=$SECONDS
# Leave ~100 s for the tests and the benchmark.
build_cap=$(($(left) - 100)); ((build_cap < 60)) && build_cap=60
# Only what this script runs; -k 0 so one run shows every compile error at once.
timeout "$build_cap" cmake --build "$BUILD" -j "$JOBS" --target vidit_tests bench_train_step bench_step_time bench_kernels vidit -- -k 0 \
  >"$LOGS/build.log" 2>&1; rc=$?
if ((rc != 0)); then
  grep -E -m 20 'error|Error' "$LOGS/build.log"
  tail -n 20 "$LOGS/build.log"
  STATUS[build]=FAIL
  DETAIL[build]="rc $rc after $((SECONDS - t0))s$([[ $rc == 124 ]] && echo ' (timed out)') (see build.log)"
  # Test whatever did get built.
else
  STATUS[build]=ok; DETAIL[build]="$((SECONDS - t0))s"
fi

# Every bench_train_step row below also runs the GPU path of "build, parallelize, then allocate"
# (session 22): the model is built on the GPU without storage (core/unallocated.h) and each
# parameter is allocated and filled there (ParallelModel::init_parts); the Torchrun one-GPU test
# does the same under FSDP (parallel.apply_all), whose gathers allocate through the CUDA caching
# allocator into storage that never held memory before.

# ---- tests --------------------------------------------------------------------------------
# The CUDA kernels against their CPU references, the model on CUDA against the CPU, the NCCL
# engine (CUDA and staged CPU tensors), and the multi-GPU code path on one GPU: one torchrun
# process over NCCL with the mesh, layouts and gradient reduction of a cluster run, against the
# plain one-process run (Torchrun.OneGpuOverNcclTrainsLikeThePlainRun), and Wan sampling on the GPU
# with fp32 and bf16 DiT weights against the CPU (SampleGpu.*), the two-expert denoise
# (Experts.CudaSamplingMatchesCpu) and Wan 2.2 TI2V's timestep per token, whose modulation takes
# the ATen composition instead of the fused kernels (Ti2v.CudaTimestepPerTokenMatchesCpu).
FILTER='LayerNormModulate*:*Cuda*:*Gpu*'
if [[ -x "$BUILD/vidit_tests" ]]; then
  say "vidit_tests --gtest_filter='$FILTER' -> $LOGS/tests.log"
  t0=$SECONDS
  timeout "$(cap 150)" stdbuf -oL -eL "$BUILD/vidit_tests" --gtest_filter="$FILTER" --gtest_color=no \
    >"$LOGS/tests.log" 2>&1; rc=$?
  if ((rc > 128 && rc != 137)) && command -v cuda-gdb >/dev/null; then
    # A crash: the same tests again under cuda-gdb for a backtrace.
    say "tests crashed (rc $rc); backtrace -> $LOGS/gdb.log"
    timeout "$(cap 90)" cuda-gdb -batch -ex run -ex bt --args "$BUILD/vidit_tests" \
      --gtest_filter="$FILTER" --gtest_color=no >"$LOGS/gdb.log" 2>&1
    grep -E '^#[0-9]+ ' "$LOGS/gdb.log" | head -n 25
  fi
  grep -E '^\[ *(OK|FAILED|SKIPPED) *\]|LNM_MAXERR|GPU_PARITY|Failure|Skipped' "$LOGS/tests.log" | head -n 60
  count() { grep -oE "^\[ *$1 *\] [0-9]+ tests?" "$LOGS/tests.log" | grep -oE '[0-9]+' | tail -n 1; }
  passed=$(count PASSED); failed=$(count FAILED); skipped=$(count SKIPPED)
  ran=$(grep -oE '^\[=+\] [0-9]+ tests? from' "$LOGS/tests.log" | grep -oE '[0-9]+' | tail -n 1)
  DETAIL[tests]="${ran:-?} ran: ${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped ($((SECONDS - t0))s)"
  if ((rc == 0)) && [[ -n "$ran" ]] && ((${ran:-0} > 0)); then
    STATUS[tests]=ok
  else
    STATUS[tests]=FAIL
    ((rc == 124)) && DETAIL[tests]+=" TIMED OUT"
    ((rc != 0 && rc != 124 && ${failed:-0} == 0)) && DETAIL[tests]+=" rc $rc (crash?)"
    failed_names=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$LOGS/tests.log" | grep -v ' listed below' |
                   awk '{print $4}' | sort -u | paste -sd ' ' -)
    [[ -n "$failed_names" ]] && DETAIL[tests]+="; failed: $failed_names"
  fi
  if [[ ${skipped:-0} -gt 0 ]]; then
    DETAIL[tests]+="; skipped: $(grep -E '^\[  SKIPPED \] [A-Za-z]' "$LOGS/tests.log" | awk '{print $4}' | sort -u | paste -sd ' ' -)"
  fi
  errs=$(grep -hoE '(LNM_MAXERR|GPU_PARITY) [A-Za-z_0-9]+ [0-9.eE+-]+' "$LOGS/tests.log" | awk '{printf "%s %s, ", $2, $3}')
  if [[ -n "$errs" ]]; then
    STATUS[kernel_error]=ok; DETAIL[kernel_error]="max |fused - reference|: ${errs%, }"
  else
    STATUS[kernel_error]="n/a"; DETAIL[kernel_error]="no LNM_MAXERR lines (CUDA kernel tests skipped or not run)"
  fi
else
  STATUS[tests]=FAIL; DETAIL[tests]="$BUILD/vidit_tests was not built"
fi

# ---- fused kernels against ATen --------------------------------------------------------------
# Wan 1.3B's real shape (32,760 tokens, dim 1536): the fused / ATen time ratio and the fused
# path's GB/s (memory-bound ops: against the H200's ~4.8 TB/s), forward and forward + backward.
if [[ -x "$BUILD/bench_kernels" ]] && (($(left) >= 40)); then
  say "bench_kernels --device cuda -> $LOGS/kernels.log"
  if timeout "$(cap 60)" "$BUILD/bench_kernels" --device cuda >"$LOGS/kernels.log" 2>&1; then
    STATUS[kernels]=ok
    DETAIL[kernels]=$(grep -E '^\{"op"' "$LOGS/kernels.log" | "$PY" -c "import json,sys
for l in sys.stdin:
    j=json.loads(l); print(f\"{j['op']} fwd {j['fwd_ratio']:.2f}x {j['fwd_gbps']:.0f} GB/s, fwd+bwd {j['fwd_bwd_ratio']:.2f}x\", end='; ')")
  else
    STATUS[kernels]=FAIL; DETAIL[kernels]="rc $? (see kernels.log)"
  fi
  grep -v '^{' "$LOGS/kernels.log"
else
  STATUS[kernels]=skipped
fi

# ---- LoRA, samples while training, profile: run between the first benchmarks and the rest,
# so a short budget still sees them (the "@extras" entry of BENCHES).
# wan_train NAME ARGS...: 4 steps of Wan 2.1 1.3B at 8,190 tokens on synthetic latents with ARGS,
# into $BUILD/gpu_NAME_run, logged to $LOGS/NAME.log (at most 90 s).
wan_train() {
  local name=$1; shift
  rm -rf "$BUILD/gpu_${name}_run"
  timeout "$(cap 90)" "$BUILD/vidit" train --fresh --config configs/wan2.1-1.3b.toml --set data.source=synthetic \
    --set data.latent_height=30 --set data.latent_width=52 --set train.steps=4 --set checkpoint.every=0 \
    "$@" --set train.out_dir="$BUILD/gpu_${name}_run" >"$LOGS/$name.log" 2>&1
}

run_extras() {
  # LoRA on the GPU (model/lora.h): Wan 2.1 1.3B frozen in FP8 (e4m3, a scale per row, multiplied as
  # fp32 under bf16 autocast), rank-32 adapters on every attention
  # projection and the MLP, bf16 autocast, 4 steps on synthetic latents; the log's step lines give
  # the step time and the trainer's LoRA line the adapters' count.
  if [[ -x "$BUILD/vidit" ]] && (($(left) >= 150)); then
    say "vidit train with lora.rank=32 (Wan 2.1 1.3B, fp8 base)"
    if wan_train lora --set train.log_every=1 --set lora.rank=32 --set lora.base_dtype=fp8 --set parallel.shard=1; then
      STATUS[lora]=ok
      DETAIL[lora]=$(grep -E '^LoRA:' "$LOGS/lora.log" | cut -c1-80; grep -E '^step +4' "$LOGS/lora.log" | tail -n 1 | cut -c1-100)
    else
      STATUS[lora]=FAIL; DETAIL[lora]="rc $? (see lora.log)"
    fi
    tail -n 3 "$LOGS/lora.log"
  else
    STATUS[lora]=skipped
  fi

  # Samples while training on the GPU (pipeline/training_samples.h): the demo's data, a small model,
  # sample.every=2 over 4 steps; the DiT samples under bf16 autocast on the GPU, the demo codec
  # decodes, and the MP4s land under samples/step_N.
  if ! command -v ffmpeg >/dev/null; then
    # The demo data and the MP4 writer need the ffmpeg program (video/video_encoder.cpp).
    STATUS[samples]=skipped; DETAIL[samples]="no ffmpeg program on this machine"
  elif [[ -x "$BUILD/vidit" ]] && (($(left) >= 120)); then
    say "vidit train with sample.every=2 (demo data, CUDA)"
    S_OUT="$BUILD/gpu_samples_run"
    rm -rf "$S_OUT"
    if timeout "$(cap 60)" "$BUILD/vidit" train --fresh --set data.source=demo --set demo.videos=12 --set train.steps=4 \
        --set sample.every=2 --set sample.count=2 --set sample.steps=4 --set train.out_dir="$S_OUT" \
        >"$LOGS/samples.log" 2>&1 && [[ $(ls "$S_OUT"/samples/step_0000004/*.mp4 2>/dev/null | wc -l) -eq 2 ]]; then
      STATUS[samples]=ok
      DETAIL[samples]=$(grep -E '^\[sample\] step 4' "$LOGS/samples.log" | cut -c1-100)
    else
      STATUS[samples]=FAIL; DETAIL[samples]="rc $? (see samples.log)"
    fi
    tail -n 3 "$LOGS/samples.log"
  else
    STATUS[samples]=skipped
  fi

  # Where a GPU step's time goes: a Kineto profile of 2 steps of Wan 2.1 1.3B at 8,190 tokens
  # (train.profile_steps; diagnose/profile.h): matmul / attention / elementwise / communication /
  # idle on the GPU, and the trace with CUDA kernels (profile/rank0.json, copied to the logs).
  if [[ -x "$BUILD/vidit" ]] && (($(left) >= 100)); then
    say "vidit train with train.profile_steps=2 (Wan 2.1 1.3B, 8,190 tokens)"
    if wan_train profile --set train.profile_steps=2 --set train.ema_decay=0; then
      STATUS[profile]=ok
      DETAIL[profile]=$(grep -E '^profile of steps' "$LOGS/profile.log" | sed 's/; trace in.*//')
      gzip -c "$BUILD/gpu_profile_run/profile/rank0.json" >"$LOGS/profile_rank0.json.gz" 2>/dev/null || true
    else
      STATUS[profile]=FAIL; DETAIL[profile]="rc $? (see profile.log)"
    fi
    grep -E '^profile of steps' "$LOGS/profile.log" || tail -n 5 "$LOGS/profile.log"
  else
    STATUS[profile]=skipped
  fi
}

# ---- benchmarks ---------------------------------------------------------------------------
# name|cap seconds|arguments. The tiny demo model (overhead-bound); Wan 2.1 1.3B at 240p x 81
# frames (21x30x52 latents, 8,190 tokens) and at its real 480x832 x 81 frames (21x60x104, 32,760
# tokens) in bf16, the latter with each attention kernel pinned (train.attention_backend) under
# the selective recompute policy, and with whole blocks recomputed (keeping every block's
# activations does not fit: ~180 GB), and recomputed per block to fit 110 GiB
# (train.memory_budget_gb: some blocks keep their activations; its GPU peak checks the plan); and
# the FP8 / bf16 pair on a matmul-bound shape: Wan 14B's width (5120, MLP 13824, 40 heads), 8
# blocks, 8,190 tokens, all blocks recomputed. Achieved TFLOP/s against the H200's 989 dense
# bf16 peak is the MFU (the FP8 rows too: model/fp8.h). The FP8 rows' loss after the same steps
# and seed against the bf16 row's is the loss gap; the FP8 row with every cast made at each use
# (train.fp8_reuse_casts = false) against the default shows what reusing the casts saves.
WAN14W="--config configs/wan2.1-1.3b.toml --set model.dim=5120 --set model.ffn_dim=13824 --set model.heads=40 --set model.layers=8 --set data.latent_height=30 --set data.latent_width=52 --set train.recompute_blocks=-1 --steps 6 --warmup 2"
BENCHES=(
  "tiny|40|--device cuda --steps 30"
  "wan1.3b_8k|90|--device cuda --config configs/wan2.1-1.3b.toml --set data.latent_height=30 --set data.latent_width=52 --steps 8 --warmup 2"
  "wan1.3b_32k_flash|90|--device cuda --config configs/wan2.1-1.3b.toml --set train.attention_backend=flash --set train.recompute_blocks=-1 --set train.recompute_policy=selective --steps 4 --warmup 2"
  "wan1.3b_32k_cudnn|90|--device cuda --config configs/wan2.1-1.3b.toml --set train.attention_backend=cudnn --set train.recompute_blocks=-1 --set train.recompute_policy=selective --steps 4 --warmup 2"
  "w14_bf16|90|--device cuda $WAN14W"
  "w14_fp8|90|--device cuda $WAN14W --set train.precision=fp8"
  "@extras"
  "wan1.3b_32k_block|90|--device cuda --config configs/wan2.1-1.3b.toml --set train.recompute_blocks=-1 --steps 4 --warmup 2"
  "wan1.3b_32k_budget|90|--device cuda --config configs/wan2.1-1.3b.toml --set train.memory_budget_gb=110 --steps 4 --warmup 2"
  "w14_fp8_rowwise|90|--device cuda $WAN14W --set train.precision=fp8_rowwise"
  "w14_fp8_every_cast|90|--device cuda $WAN14W --set train.precision=fp8 --set train.fp8_reuse_casts=false"
)
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
bench_detail=()
declare -A STEP_S LOSS
if [[ -x "$BUILD/bench_train_step" ]]; then
  STATUS[bench]=ok
  : >"$LOGS/bench.log"
  for entry in "${BENCHES[@]}"; do
    if [[ $entry == @extras ]]; then run_extras; continue; fi
    IFS='|' read -r name bcap bargs <<<"$entry"
    if (($(left) < 20)); then bench_detail+=("$name skipped (no time)"); continue; fi
    say "bench $name: bench_train_step $bargs"
    t0=$SECONDS
    # shellcheck disable=SC2086
    timeout "$(cap "$bcap")" "$BUILD/bench_train_step" $bargs >"$LOGS/bench_$name.log" 2>&1; rc=$?
    cat "$LOGS/bench_$name.log" >>"$LOGS/bench.log"
    tail -n 4 "$LOGS/bench_$name.log"
    js=$(grep -E '^\{.*"gflops"' "$LOGS/bench_$name.log" | tail -n 1)
    if ((rc == 0)) && [[ -n "$js" ]]; then
      bench_detail+=("$(echo "$js" | "$PY" -c "import json,sys; j=json.load(sys.stdin); t=j['gflops']/1e3; print(f\"$name {j['step_time_s']*1e3:.1f} ms/step, {t:.1f} TFLOP/s, MFU {100*t/$PEAK_TFLOPS:.1f}%, GPU peak {j.get('gpu_peak_gb', 0):.1f} GB, loss {j.get('mean_loss', 0):.4f}\")")")
      STEP_S[$name]=$(echo "$js" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['step_time_s'])")
      LOSS[$name]=$(echo "$js" | "$PY" -c "import json,sys; print(json.load(sys.stdin).get('mean_loss', 0))")
    else
      STATUS[bench]=FAIL
      bench_detail+=("$name rc $rc$([[ $rc == 124 ]] && echo ' timed out')")
    fi
  done
  DETAIL[bench]=$(printf '%s; ' "${bench_detail[@]}")
  # FP8 against bf16 at the 14B width: the speed-up (goal >= 1.25) and the loss gap (goal <= 2%).
  for v in w14_fp8 w14_fp8_rowwise; do
    if [[ -n "${STEP_S[w14_bf16]:-}" && -n "${STEP_S[$v]:-}" ]]; then
      STATUS[fp8]=ok
      DETAIL[fp8]+=$("$PY" -c "b,f,lb,lf=${STEP_S[w14_bf16]},${STEP_S[$v]},${LOSS[w14_bf16]},${LOSS[$v]}; print(f'$v bf16/fp8 step {b/f:.2f}x, loss gap {100*abs(lf-lb)/lb:.2f}%; ')")
    fi
  done
  # Casts reused (train.fp8_reuse_casts, the default) against cast at every use: the same loss.
  if [[ -n "${STEP_S[w14_fp8]:-}" && -n "${STEP_S[w14_fp8_every_cast]:-}" ]]; then
    DETAIL[fp8]+=$("$PY" -c "a,b,la,lb=${STEP_S[w14_fp8]},${STEP_S[w14_fp8_every_cast]},${LOSS[w14_fp8]},${LOSS[w14_fp8_every_cast]}; print(f'fp8 step, casts at every use / reused {b/a:.2f}x (loss {la:.5f} vs {lb:.5f}); ')")
  fi
else
  STATUS[bench]=absent; DETAIL[bench]="$BUILD/bench_train_step not built"
fi

# The step-time model (vidit plan --measure cuda) against measured GPU steps.
if [[ -x "$BUILD/bench_step_time" ]] && (($(left) >= 60)); then
  say "bench_step_time --device cuda"
  if timeout "$(cap 90)" "$BUILD/bench_step_time" --device cuda >"$LOGS/step_time.log" 2>&1; then
    STATUS[step_time]=ok
    DETAIL[step_time]=$(awk '$1 ~ /^(wide|middle|long)$/ { printf "%s measured/predicted %s; ", $1, $(NF-1) }' "$LOGS/step_time.log")
  else
    STATUS[step_time]=FAIL; DETAIL[step_time]="rc $? (see step_time.log)"
  fi
  cat "$LOGS/step_time.log"
else
  STATUS[step_time]=skipped
fi

summary
[[ ${STATUS[configure]} == ok && ${STATUS[build]} == ok && ${STATUS[tests]} == ok ]]

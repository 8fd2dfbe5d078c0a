# Sourced by bench_overlap.sh and bench_fsdp_gather.sh: the model both train with its parameters
# sharded over 2 processes (dim 512, MLP 2048, 4 blocks, 64 tokens a sample, one thread per rank:
# a block's fp32 all-gather, about 17 MB, is comparable to its compute), bench_train_step, and a
# scratch folder. In: NAME (for messages), BUILD. Out: BENCH, PY, SETS, TMP (removed at exit).
BENCH=$BUILD/bench_train_step
[[ -x "$BENCH" ]] || { echo "$NAME: $BENCH not built (cmake --build $BUILD)"; exit 1; }
PY=${PYTHON:-python3}
SETS=(model.dim=512 model.ffn_dim=2048 model.heads=8 model.layers=4 model.patch=[1,2,2]
      data.latent_frames=4 data.latent_height=8 data.latent_width=8 train.batch_size=2
      train.threads=1 parallel.shard=2)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

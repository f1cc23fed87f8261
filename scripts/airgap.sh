#!/usr/bin/env bash
# Run this project's GPU commands on a host without network access (no package index, no model hub) that
# already has torch and transformers: pack what it lacks here, carry it over, run there.
#
#   here:   bash scripts/airgap.sh pack               # .whl/ (msgspec, pyzmq, gguf wheels for CPython 3.12),
#                                                     # .gguf/part-a, .gguf/part-b (the embedded target's GGUF in
#                                                     # two parts under 64 MiB, for transfers of limited size),
#                                                     # .gguf/prompts.json.xz (the ShareGPT first turns)
#   there:  bash scripts/airgap.sh stage FILE...      # keep FILEs in $STAGE until the rest arrives
#           bash scripts/airgap.sh sdeth ARGS...      # install the wheels, reassemble the GGUF from $STAGE and .gguf/
#                                                     # when its parts are there, run `python3 -m sdeth ARGS...`
#           bash scripts/airgap.sh distill ARGS...    # the same set-up, then train the embedded draft on the GPU
#                                                     # (python3 -m sdeth.models.distill --device cuda ARGS...)
#
# Random-weight benchmarks (bench step, bench sd with a random-qwen3 pair) need only .whl/; the embedded pair's
# real weights need both GGUF parts and the prompts. STAGE defaults to ~/.cache/sdeth/stage; results go where
# ARGS say (e.g. --json "$OUT/bench_step.json").
set -euo pipefail
cmd=${1:?pack|stage|sdeth|distill}; shift || true
STAGE=${STAGE:-$HOME/.cache/sdeth/stage}
setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STAGE/site" .whl/*.whl
  export PYTHONPATH="$STAGE/site:$PWD/lib" PYTHONUNBUFFERED=1 SDETH_CACHE="$STAGE/cache"
  mkdir -p "$STAGE/cache/prompts"
  for p in "$STAGE"/part-a .gguf/part-a; do [ -f "$p" ] && a=$p; done
  for p in "$STAGE"/part-b .gguf/part-b; do [ -f "$p" ] && b=$p; done
  if [ -n "${a:-}" ] && [ -n "${b:-}" ]; then
    cat "$a" "$b" > "$STAGE/model.gguf" && export SDETH_GGUF="$STAGE/model.gguf"
  fi
  if [ -f .gguf/prompts.json.xz ]; then
    xz -dc .gguf/prompts.json.xz > "$STAGE/cache/prompts/sharegpt_first_turns.json"
  fi
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv,noheader || true
}
case "$cmd" in
pack)
  mkdir -p .gguf .whl
  gguf=$(.venv/bin/python -c 'from sdeth.models.embedded import _gguf_path; print(_gguf_path())')
  head -c 55000000 "$gguf" > .gguf/part-a
  tail -c +55000001 "$gguf" > .gguf/part-b
  .venv/bin/python -c 'from sdeth.models.prompts import sharegpt_first_turns; sharegpt_first_turns()'
  xz -T2 -c "${SDETH_CACHE:-$HOME/.cache/sdeth}/prompts/sharegpt_first_turns.json" > .gguf/prompts.json.xz
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    gguf==0.19.0 pyzmq==27.3.0 msgspec==0.23.0
  ls -la .gguf .whl ;;
stage)
  mkdir -p "$STAGE" && cp "$@" "$STAGE"/ && ls -la "$STAGE" ;;
sdeth)
  setup
  python3 -m sdeth "$@" ;;
distill)
  setup
  python3 -m sdeth.models.distill --device cuda "$@" ;;
*)
  echo "airgap.sh: unknown command $cmd (pack | stage FILE... | sdeth ARGS... | distill ARGS...)" >&2; exit 2 ;;
esac

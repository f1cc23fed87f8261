#!/usr/bin/env bash
# Distil the embedded draft on a lent GPU (device tool), with the same `sdeth.models.distill` as the CPU path.
# The 98 MB GGUF exceeds one device call's 64 MiB carry, so it travels in two parts over two calls
# on a warm machine:
#   here:    bash scripts/gpu_distill.sh pack            # .gguf/part-a, .gguf/part-b, .gguf/prompts.json.xz
#   call 1:  bash scripts/gpu_distill.sh stage            # carry .gguf/part-a: kept in /tmp/stage
#   call 2:  bash scripts/gpu_distill.sh train [ARGS]     # carry .gguf/part-b .gguf/prompts.json.xz .whl
# Outputs (draft layers split into <16 MiB pieces, cards, log) go to $OUT.
set -euo pipefail
cmd=${1:?pack|stage|train}; shift || true
case "$cmd" in
pack)
  gguf=$(.venv/bin/python -c 'from sdeth.models.embedded import _gguf_path; print(_gguf_path())')
  head -c 55000000 "$gguf" > .gguf/part-a
  tail -c +55000001 "$gguf" > .gguf/part-b
  .venv/bin/python -c 'from sdeth.models.prompts import sharegpt_first_turns; sharegpt_first_turns()'
  xz -T2 -c "${SDETH_CACHE:-$HOME/.cache/sdeth}/prompts/sharegpt_first_turns.json" > .gguf/prompts.json.xz
  ls -la .gguf ;;
stage)
  mkdir -p /tmp/stage && cp .gguf/part-a /tmp/stage/ && ls -la /tmp/stage ;;
train)
  cat /tmp/stage/part-a .gguf/part-b > /tmp/model.gguf
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/lib SDETH_GGUF=/tmp/model.gguf SDETH_CACHE=/tmp/cache PYTHONUNBUFFERED=1
  mkdir -p /tmp/cache/prompts && xz -dc .gguf/prompts.json.xz > /tmp/cache/prompts/sharegpt_first_turns.json
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -m sdeth.models.distill --out /tmp/draft --device cuda "$@" 2>&1 | grep -v 'it/s]' | tee "$OUT/distill.log"
  for d in /tmp/draft /tmp/draft/L*; do [ -f "$d/draft.safetensors" ] || continue
    n=$(python3 -c "import json,sys; print('L%d' % json.load(open(sys.argv[1]))['layers'])" "$d/card.json")
    split -b 15M -d "$d/draft.safetensors" "$OUT/$n.safetensors.part"
    tar -C "$d" -cf "$OUT/$n.meta.tar" config.json card.json; done
  ls -la "$OUT" ;;
esac

#!/usr/bin/env bash
# The GPU issue's figures (scripts/gpu_bench.py) on a lent nvidia-h200-x2 machine, in three device calls
# made back to back (the machine stays warm 30 s; /tmp there survives between them):
#   here:    bash scripts/gpu_run.sh pack          # .gguf/part-a, .gguf/part-b, .gguf/prompts.json.xz, .whl/
#   call 1:  bash scripts/gpu_run.sh engine        # carry .gguf/part-a .whl    engine benchmarks, both GPUs
#            (or stage-a: only part-a, when the engine benchmarks ran in an earlier lease)
#   call 2:  bash scripts/gpu_run.sh stage-b       # carry .gguf/part-b         the GGUF reassembled in /tmp/stage
#   call 3:  bash scripts/gpu_run.sh sd            # carry .whl .gguf/prompts.json.xz   real weights + two-GPU SD
# The 98 MB GGUF and the 42 MB draft asset do not fit one call's 64 MiB together: for calls 1 and 2 take
# the draft asset out of the index (git rm -r --cached lib/sdeth/assets/embedded-draft, and ignore it in
# .git/info/exclude), then put it back (git add) before call 3. Results land in $OUT as JSON and logs;
# copy them to reports/ (gpu_engine.json, gpu_sd.json, gpu_real.json).
set -euo pipefail
cmd=${1:?pack|engine|stage-b|sd}; shift || true
setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/lib PYTHONUNBUFFERED=1 SDETH_CACHE=/tmp/cache
  mkdir -p /tmp/stage "$OUT"
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv,noheader
}
case "$cmd" in
pack)
  mkdir -p .gguf
  bash scripts/gpu_distill.sh pack
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    gguf==0.19.0 pyzmq==27.3.0 msgspec==0.23.0 ;;
engine)
  setup
  cp .gguf/part-a /tmp/stage/
  python3 scripts/gpu_bench.py engine --models Qwen3-8B --device cuda:0 --budget-s "${BUDGET:-420}" \
    --json "$OUT/gpu_engine_8b.json" > "$OUT/engine_8b.log" 2>&1 &
  python3 scripts/gpu_bench.py engine --models Qwen3-0.6B,Qwen3-1.7B --device cuda:1 --budget-s "${BUDGET:-420}" \
    --json "$OUT/gpu_engine_small.json" > "$OUT/engine_small.log" 2>&1 &
  wait
  cp "$OUT"/gpu_engine_*.json /tmp/stage/
  grep -h '"variant"' "$OUT"/engine_*.log | cut -c1-400 || true
  tail -5 "$OUT"/engine_*.log ;;
final)
  # engine benchmarks (both GPUs at once), then two-GPU SD on the fastest 8B variant; no real weights
  setup
  python3 scripts/gpu_bench.py engine --models Qwen3-8B --device cuda:0 --variants "${ENGINE_VARIANTS:-fast-graph,fast-compile}" \
    --budget-s "${BUDGET:-260}" --json "$OUT/gpu_engine_8b.json" > "$OUT/engine_8b.log" 2>&1 &
  python3 scripts/gpu_bench.py engine --models Qwen3-0.6B,Qwen3-1.7B --device cuda:1 \
    --variants "${ENGINE_VARIANTS:-fast-graph,fast-compile}" --budget-s "${BUDGET:-260}" \
    --json "$OUT/gpu_engine_small.json" > "$OUT/engine_small.log" 2>&1 &
  wait
  cp "$OUT"/gpu_engine_*.json /tmp/stage/ 2>/dev/null || true
  grep -h '^{"model"' "$OUT"/engine_*.log | cut -c1-260
  variant=$(python3 -c "
import json
rows = [r for r in json.load(open('/tmp/stage/gpu_engine_8b.json'))['rows'] if 'forward_m1_ms' in r and 'error' not in r]
print(min(rows, key=lambda r: r['forward_m1_ms'])['variant'] if rows else 'fast-graph')")
  echo "engine variant for SD: $variant"
  python3 scripts/gpu_bench.py sd --variant "$variant" --budget-s "${SD_BUDGET:-150}" --json "$OUT/gpu_sd.json" \
    > "$OUT/sd.log" 2>&1 || echo "sd: rc=$?"
  grep -v 'it/s' "$OUT/sd.log" | tail -14 ;;
stage-a)
  mkdir -p /tmp/stage && cp .gguf/part-a /tmp/stage/ && ls -la /tmp/stage ;;
stage-b)
  cat /tmp/stage/part-a .gguf/part-b > /tmp/stage/model.gguf
  ls -la /tmp/stage && sha256sum /tmp/stage/model.gguf ;;
sd)
  setup
  mkdir -p /tmp/cache/prompts && xz -dc .gguf/prompts.json.xz > /tmp/cache/prompts/sharegpt_first_turns.json
  variant=$(python3 - <<'PY'
import json, glob
best = None
for f in glob.glob("/tmp/stage/gpu_engine_8b.json"):
    for r in json.load(open(f))["rows"]:
        if "forward_m1_ms" in r and "error" not in r and (best is None or r["forward_m1_ms"] < best[1]):
            best = (r["variant"], r["forward_m1_ms"])
print(best[0] if best else "fast-compile")
PY
)
  variant=${VARIANT:-$variant}
  echo "engine variant for SD: $variant"
  if [ -n "${ENGINE_MODELS:-}" ]; then
    python3 scripts/gpu_bench.py engine --models "$ENGINE_MODELS" --variants "${ENGINE_VARIANTS:-hf-graph,fast-graph}" \
      --device cuda:1 --json "$OUT/gpu_engine_extra.json" > "$OUT/engine_extra.log" 2>&1 &
  fi
  SDETH_GGUF=/tmp/stage/model.gguf timeout 200 python3 scripts/gpu_bench.py real --json "$OUT/gpu_real.json" \
    > "$OUT/real.log" 2>&1 || echo "real: rc=$?"
  tail -4 "$OUT/real.log"
  wait
  python3 scripts/gpu_bench.py sd --variant "$variant" --budget-s "${BUDGET:-300}" --json "$OUT/gpu_sd.json" \
    > "$OUT/sd.log" 2>&1 || echo "sd: rc=$?"
  grep -v 'it/s' "$OUT/sd.log" | tail -25 ;;
esac

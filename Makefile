# Two commands do everything on a fresh machine (see README):
#   make report   set up .venv, prepare the embedded pair, run the notebooks, render reports/
#   make test     set up .venv, run the unit + real-model tests and the notebooks (nbval)
# GPU=1 selects the CUDA environment (requirements/gpu-*.txt) instead of the CPU one.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
ifeq ($(GPU),1)
  REQ := gpu
else
  REQ := cpu
endif
# torch 2.13.0+cpu lives on the PyTorch CPU index; when pip is configured with a local wheel
# directory (find-links) that already has it, no extra index is needed.
LOCAL_WHEELS ?= $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null || echo $$PIP_FIND_LINKS)
TORCH_INDEX ?= $(if $(wildcard $(LOCAL_WHEELS)/torch-2.13.0+cpu*),,--extra-index-url https://download.pytorch.org/whl/cpu)
STAMP  := $(VENV)/.installed-$(REQ)

.PHONY: venv prepare test test-fast test-vllm-server soak report clean-reports distill-cpu bench-gpu bench-step bench-vllm bench-baseline-h200 bench-branches-h200 bench-floor-h200 bench-link-h200 bench-batch16-h200 bench-h200-open bench-policy-cpu bench-link-cpu

venv: $(STAMP)

# The CPU environment takes about 4.5 GB in .venv (torch, vLLM) and pip unpacks wheels in TMPDIR on the way:
# with less than NEED_GB GiB free in either place, stop before pip does, naming the folder and what it has.
NEED_GB ?= 6
$(STAMP): requirements/$(REQ)-deps.txt requirements/$(REQ)-nodeps.txt pyproject.toml
	@for d in . "$${TMPDIR:-/tmp}"; do \
	  free=$$(df -Pk "$$d" | awk 'NR==2 {print int($$4 / 1048576)}'); \
	  [ -n "$$free" ] || { echo "make: cannot read the free space of $$d (df -Pk failed): check TMPDIR" >&2; exit 1; }; \
	  if [ "$$free" -lt $(NEED_GB) ]; then \
	    echo "make: $$(cd "$$d" && pwd) has $$free GiB free; setting up $(VENV) needs about $(NEED_GB) GiB there." \
	      "Free some space (old clones, pip's cache), point TMPDIR elsewhere, or set NEED_GB=N to go on anyway." >&2; \
	    exit 1; \
	  fi; \
	done
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip wheel
	$(PIP) install -q $(if $(filter cpu,$(REQ)),$(TORCH_INDEX)) -r requirements/$(REQ)-deps.txt
	$(PIP) install -q --no-deps -r requirements/$(REQ)-nodeps.txt
	$(PIP) install -q --no-deps --no-build-isolation -e .
	$(PY) -m sdeth.envcheck $(REQ)
	rm -f $(VENV)/.installed-*
	touch $@

prepare: venv
	$(PY) -m sdeth prepare

# The tests run several torch processes and threads at once (workers, draft servers, vLLM, a target beside its
# draft) on few cores: OpenMP threads that spin at a barrier hold the core their partner waits for (a decode step
# 2.7x slower beside one busy process); passive ones sleep there, and cost nothing when alone.
test test-fast: export OMP_WAIT_POLICY = PASSIVE
test: prepare
	$(PY) -m pytest -q --durations=15 tests
	rm -rf $(VENV)/nbtest && $(PY) -m sdeth.study.pages.report --test-copies $(VENV)/nbtest
	SDETH_REPORTS=$(VENV)/test-reports $(PY) -m pytest -q --durations=15 --nbval-lax $(VENV)/nbtest

soak: prepare
	$(PY) -m sdeth soak --requests 2000 --clients 4 --json $(VENV)/soak.json

test-fast: venv
	$(PY) -m pytest -q -m "not slow" tests

test-vllm-server: prepare   # vLLM's OpenAI server with the remote proposer, sync, stream and policy modes: greedy identity, T=0.8, counters (~30 min)
	SDETH_VLLM_SERVER_TESTS=1 $(PY) -m pytest -q -s tests/test_vllm_proposer.py tests/test_vllm_stream.py -k "(openai_server or t08 or counters_agree) and not prefix_cached"

bench-vllm: prepare   # vLLM target-only, its own draft and a remote draft server, concurrency 1-8, two repeats (reports/vllm_remote_cpu.json); the remote proposer's policy, sync and stream modes per step (reports/vllm_stream_cpu.json)
	$(PY) -m sdeth bench vllm --repeats 2 --json reports/vllm_remote_cpu.json
	$(PY) -m sdeth.study.vllm.stream --json reports/vllm_stream_cpu.json

report: prepare
	$(PY) -m sdeth.study.pages.report

distill-cpu: venv
	$(PY) -m sdeth.models.distill --out $(VENV)/draft-cpu --layers 6 --prompts 320 --gen-tokens 96 --train-minutes 8

# The fast-path figures on a host with two GPUs (random Qwen3-shaped weights; reports/gpu/bench_sd_*.json):
# synthetic acceptance for the 1.7B and 0.6B drafts, trace-driven for the 1.7B (the embedded pair's trace).
# BENCH_PY: the Python that has the package (default this venv's).
BENCH_PY ?= $(PY)
BENCH := $(BENCH_PY) -m sdeth bench sd --device cuda:0 --draft-device cuda:1 --impl fast --compile default \
	--requests 16 --context 512 --max-tokens 128 --k 3 --k-max 8
bench-gpu:
	$(BENCH) --pair random-qwen3-8b/1.7b --synthetic-alpha 0.71 --json reports/gpu/bench_sd_1.7b.json
	$(BENCH) --pair random-qwen3-8b/0.6b --synthetic-alpha 0.56 --json reports/gpu/bench_sd_0.6b.json
	$(BENCH) --pair random-qwen3-8b/1.7b --synthetic-alpha 0.71 --trace reports/traces/embedded_greedy.json \
		--modes target-only,sync,pipelined --json reports/gpu/bench_sd_1.7b_trace.json

# One baseline for every option, and the step policies side by side, on one H200 (calls 10 and 11 ran this; about
# 8 minutes a call): the 8B, 32B and 72B-class targets emulated at their measured t_v against the real draft server,
# colocated SD in the same harness (real draft steps, the target's t_v in series), and each pipelined point under
# the step policy, sync (wait for k) and offered (what is on offer), each point for about 1,000 target steps (at most
# 12 s), with a 95% interval. The files go into study.results.POLICY_STREAMS; the decision table and 25_draft_server
# read them. Then the 8B link curve (the real draft worker through the delay relay at 0.02-5 ms; one GPU: give
# --draft-device cuda:0).
BASELINE_STREAMS := $(BENCH_PY) -m sdeth bench streams --budget-s 470 --models-compile default --compile "" \
	--batches 1,4 --verify-ks 1,2,3,4 --colocated-ks 3 --colocated-s 4 --no-sync --remote-s 4 --min-steps 1000 \
	--max-s 12 --policy policy,sync,offered
bench-baseline-h200:
	$(BASELINE_STREAMS) --call 12 --colocated-emulated Qwen3-8B,Qwen3-32B,Qwen2.5-72B --pipelined 1:1,1:4,4:4 \
		--big-targets Qwen3-32B,Qwen2.5-72B --big-points 1:1,1:4,4:4 --json reports/gpu/bench_streams_server_12.json
	$(BENCH_PY) -m sdeth bench rtt --pair random-qwen3-8b/1.7b --synthetic-alpha 0.71 --device cuda:0 \
		--draft-device cuda:1 --impl fast --compile default --requests 16 --context 512 --max-tokens 128 \
		--k 3 --k-max 8 --rtts 0.02,0.5,2,5 --json reports/gpu/bench_rtt_1.7b_link.json

# Branches sent ahead, on one GPU (about 8 minutes a call; run it twice, CALL=12 then CALL=13: timings move between
# calls): colocated SD in the remote options' harness (the 8B, 32B and 72B-class targets emulated at their measured
# t_v), then branches sent ahead against the verdict cache off at three hit rates (synthetic 0.9 and 0.5, the
# embedded pair's trace) at B=1 N=1 and on a full server (4 targets of 4 streams on 16 rows)
# (reports/gpu/bench_streams_ssd_<CALL>.json; 25_draft_server reads every such file).
CALL ?= 12
bench-branches-h200:
	$(BENCH_PY) -m sdeth bench streams --call $(CALL) --only-ssd --models-compile default --compile "" \
		--colocated-emulated Qwen3-8B,Qwen3-32B,Qwen2.5-72B --batches 1 --colocated-ks 3 --colocated-s 4 \
		--verdict-cache off,4x4x8+ahead --ssd-targets Qwen3-8B,Qwen3-32B,Qwen2.5-72B --ssd-points 1:1,4:4 \
		--ssd-rows 16 --ssd-ranks synthetic:0.9,synthetic:0.5,trace --ssd-s 8 --budget-s 540 \
		--json reports/gpu/bench_streams_ssd_$(CALL).json

# The remote path at its floor, on one GPU (about 4 minutes a call; twice, as above): the draft server (its stream
# steps launched ahead, its draft with the fused kernels) under the step policy and its two corners, "offered" and
# sync, at B=1 N=4, B=4 N=4 (16 rows) and B=1 N=1 for the three emulated targets: the period, the restart timeline,
# each speed goal and the event model of each point (reports/gpu/bench_streams_ssd_<CALL>.json; 25_draft_server).
bench-floor-h200:
	$(BENCH_PY) -m sdeth bench streams --call $(CALL) --only-ssd --models-compile default --compile "" --batches 1 \
		--verdict-cache off --ssd-targets Qwen3-32B,Qwen2.5-72B,Qwen3-8B --ssd-points 4:4,1:4,1:1 \
		--ssd-rows 16 --ssd-ranks synthetic:0.9 --ssd-policy offered,policy,sync --ssd-s 5 --budget-s 400 \
		--json reports/gpu/bench_streams_ssd_$(CALL).json

# What Ethernet costs, and real colocated SD beside its emulation, on one GPU (about 7 minutes a call; twice, as
# above): colocated SD with the 8B and 32B shapes as real targets (random bf16 weights) beside the same targets
# emulated at the t_v the call measures, colocated SD in the same harness for the three shapes, then the link curve:
# each emulated target through a delay relay at 0.02, 0.5, 1 and 2 ms injected round trip, under the step policy and
# sync (reports/gpu/bench_streams_link_<CALL>.json; 25_draft_server and the decision table's details read it).
bench-link-h200:
	$(BENCH_PY) -m sdeth bench streams --call $(CALL) --only-link --models-compile default --compile "" \
		--colocated-emulated Qwen3-8B,Qwen3-32B,Qwen2.5-72B --colocated-real Qwen3-8B,Qwen3-32B --batches 1 \
		--colocated-ks 3 --colocated-s 4 --link-rtts 0.02,0.5,1,2 --link-points 1:1 --policy policy,sync \
		--min-steps 1000 --max-s 6 --remote-s 3 --budget-s 540 --json reports/gpu/bench_streams_link_$(CALL).json

# B = 16 streams per target in the same harness (about 6 minutes): the draft step, the 8B target's t_v and real
# colocated SD at B = 16, colocated SD against the three emulated shapes, and remote pipelined streams (16 streams, one
# target per draft GPU) under the step policy, sync and offered (reports/gpu/bench_streams_server_<CALL>.json; add
# it to study.results.POLICY_STREAMS for the decision table's relaxed cells).
bench-batch16-h200:
	$(BASELINE_STREAMS) --call $(CALL) --batches 16 --colocated-emulated Qwen3-8B,Qwen3-32B,Qwen2.5-72B \
		--pipelined 16:1 --big-targets Qwen3-32B,Qwen2.5-72B --big-points 16:1 \
		--json reports/gpu/bench_streams_server_$(CALL).json

# Every GPU figure still open, one call each on one GPU (run twice with two CALL numbers: timings move between calls)
bench-h200-open: bench-floor-h200 bench-link-h200 bench-branches-h200 bench-batch16-h200

# The step policies on the CPU testbed (about 1 minute): the embedded pair through the real draft server on a core of
# its own, 1 and 4 streams, policy against sync and offered, and the restart in server periods (reports/policy_cpu.json;
# its repeats of an older run removed). Then `make bench-policy-cpu REPEAT=2` (3, ...): the same again, beside it
# (reports/policy_cpu_2.json); 25_draft_server reads each run.
REPEAT ?=
bench-policy-cpu: prepare
	$(if $(REPEAT),,rm -f reports/policy_cpu_[0-9]*.json)
	$(PY) -m sdeth bench ssd-cpu --specs off --streams 1,4 --policies policy,sync,offered --draft-core 1 --no-model \
		--json reports/policy_cpu$(if $(REPEAT),_$(REPEAT)).json

# What Ethernet costs on the CPU testbed: the link curve through the real draft server at 0.02-40 ms (reports/link_cpu.json, ~5 min)
bench-link-cpu: prepare
	$(PY) -m sdeth bench link --rtts 0.02,0.5,2,10,40 --json reports/link_cpu.json

# The decode step, lever by lever, on one GPU (reports/gpu/bench_step_<date>.json; 20_ethernet reads every
# bench_step*.json in reports/gpu beside the committed runs).
bench-step:
	$(BENCH_PY) -m sdeth bench step --device cuda:0 --json reports/gpu/bench_step_$$(date +%Y%m%d-%H%M).json

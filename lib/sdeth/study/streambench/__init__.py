"""Many streams over one draft GPU (`python -m sdeth bench streams`): the batched draft step, the target's
batched verify, colocated SD of B streams on one GPU, and a real draft server serving N emulated targets.

Random bf16 weights of the Qwen3-8B target shape and the Qwen3-1.7B / 0.6B draft shapes (runtime.randomweights):
timing does not depend on the values, and the draft's tokens mean nothing, so acceptance is synthetic. The
target side tosses a coin per drafted token (heads with probability alpha: 0.71 with the 1.7B, 0.56 with the
0.6B, the alphas bench sd used with the 8B), accepts the drafts up to the first tails and adds its own token.

Terms (ms; at context c a row's highest position is c - 1 and attention reads c cache slots):
- draft_step: one BatchDecoder step of width 1 over B rows, its CUDA graph replayed back to back (device);
  draft_wall_ms: BatchDrafter.draft of k tokens for B sequences, the read to the host included;
  host_ms_per_step: (that wall - the same steps' device time) / k, the host work the device waits for.
- target: t(B) (width 1) and t_v(B, k) (width k + 1, logits for every column) of the Qwen3-8B shape, graph
  replayed back to back (device); wall_ms adds the input copy, the argmax and the read to the host.
- colocated (measured): both models on one GPU in one process, B streams in lockstep: a round drafts k tokens
  for every stream, verifies B x (k + 1) on the target, tosses the coins, tells the draft.
- remote (emulated target, real draft server): the draft server (wire.draft_server, one 1.7B shape with 128
  cache rows) in a process of its own on the GPU, over loopback TCP; N targets, each a process of its own with
  B streams in lockstep through one DraftServerClient: one Rounds per round, then a wait of the measured
  t_v(B, k) in place of the verify (sleep, then spin for the last SPIN_S), then the coins.
Streams run sequences of PROMPT up to CONTEXT tokens: a sequence whose next round would pass CONTEXT ends and a
new one opens with a new prompt, which the draft prefills while the others run; the target's prefill is not
charged (TPOT, as vLLM defines it, leaves the first token out).
TPOT per stream: a round's time over the tokens it gave that stream (p50, p99 over streams and rounds), and the
mean (time over tokens). tokens/s per GPU: all streams' tokens per second over the GPUs the setup uses.
- pipelined (emulated target, real draft server): N targets of B streams each commit to the server and take what
  it streamed; each point carries the stream timeline (a commit sent, read by the server, the first draft after
  it stepped, arrived, verified: p50/p99 of each gap), the server's streams held against the live ones, and the
  event model (costmodel.simulate_pipelined) fed the point's measured server step.
- big_targets: the same against emulated Qwen3-32B / Qwen2.5-72B (fp8) targets, their t_v from `bench targets`.

- ssd (`--verdict-cache off,on`, `--only-ssd`): the draft server's verdict cache, off and on side by side against
  emulated 8B / 32B / 72B targets whose acceptance carries ranks (ranks: trace-driven or labelled synthetic).

Modules: common (constants, the typed Grid), draftstep, target, colocated, server (the draft server's
process), emulated (the emulated targets' processes; emulated_sync, emulated_pipelined: the targets), remote
(the remote parts), printout (rows, notes), call (one call, the command line), ranks, ssd.
"""
from __future__ import annotations

from .call import main, run_call
from .colocated import Colocated, best_k, colocated_point
from .common import (BATCHES, CONTEXT, PIPELINED_K, PIPELINED_LABEL, PIPELINED_WINDOW, PREFILL_CHUNK, PROMPT,
                     REMOTE_LABEL, SERVER_ROWS, SLACK, TARGET, TIMELINE, Grid, coins, hello, mean, pct,
                     pipelined_grid, welcome)
from .draftstep import draft_step, goal_check
from .emulated import Emulated, EmulatedPipelined, Targets
from .remote import pipelined_part, pipelined_record, remote_grid, remote_points, remote_record
from .server import serve_random
from .target import big_tv, target_points, tv_table

__all__ = ["BATCHES", "CONTEXT", "PIPELINED_K", "PIPELINED_LABEL", "PIPELINED_WINDOW", "PREFILL_CHUNK", "PROMPT",
           "REMOTE_LABEL", "SERVER_ROWS", "SLACK", "TARGET", "TIMELINE", "Colocated", "Emulated",
           "EmulatedPipelined", "Grid", "Targets", "best_k", "big_tv", "coins", "colocated_point", "draft_step",
           "goal_check", "hello", "main", "mean", "pct", "pipelined_grid", "pipelined_part", "pipelined_record",
           "remote_grid", "remote_points", "remote_record", "run_call", "serve_random", "target_points", "tv_table",
           "welcome"]

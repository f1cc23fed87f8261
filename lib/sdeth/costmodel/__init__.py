"""What SD should deliver, from alpha, k and component costs, and the policies it drives: a leaf (it imports
nothing of sdeth outside itself), in rooms; their public names (and _policy) are re-exported here:
    rounds       one synchronous round's yield E(alpha, k) and cost T(k), SD's speedup and best k
    rules        the step policy's wait rules and their long-run rate over a restart cycle
    cacheterms   the outcome and verdict caches as the event model sees them
    modeldraft   the event model's draft: its steps and what a Commit does to its run
    policies     the policies that choose each round's drafts
    eventmodel   the event model that plays them against modelled drafts (simulate_pipelined)
"""
from .rounds import (Costs, best_k, expected_tokens, predicted_run_tokens_per_s, round_time,  # noqa: F401
                     sd_tokens_per_s, speedup)
from .rules import (CORNER_MARGIN, CYCLE_ROUNDS, OVERDUE, PHASES, RULE_EVERY, WaitRule, best_rule,  # noqa: F401
                    best_rule_steps, link_of_restart, rule_rate)
from .cacheterms import CacheTerms, cache_terms, fanouts, verdict_terms  # noqa: F401
from .modeldraft import DraftStep  # noqa: F401
from .policies import (POLICIES, SETTINGS,  # noqa: F401
                       AdaptivePolicy, FixedPolicy, OfferedPolicy, StepPolicy, SyncPolicy, _policy, setting_of,
                       step_setting)
from .eventmodel import pipelined_speedup, simulate_pipelined  # noqa: F401

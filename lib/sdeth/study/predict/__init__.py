"""The models that predict: TPOT against tokens/s per GPU (pareto), the event model against every measurement
(modelcheck), which draft hardware pays (hetero)."""

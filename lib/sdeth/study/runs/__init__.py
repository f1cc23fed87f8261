"""Runs: one configuration -> one results JSON (experiment), the soak under faults, the acceptance study."""

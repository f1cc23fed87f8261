"""The study: run configuration (`config`), experiments and sweeps (`experiment`), summaries
(`summary`), the acceptance study (`acceptance`), vLLM as the reference engine (`vllm_baseline`) and
the reports (`report`)."""

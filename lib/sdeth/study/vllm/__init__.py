"""vLLM in the study: the reference engine (target-only and its own draft-model SD), and vLLM with the remote draft
(`python -m sdeth bench vllm`)."""

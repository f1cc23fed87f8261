"""The study, in rooms: what every run shares (`config`, `results`, `summary`), vLLM as the reference and with the
remote draft (`vllm/`), runs and the acceptance study (`runs/`), the models that predict (`predict/`), the
benchmarks (`bench/`, `streambench/`), the answer (`status/`) and the rendered reports (`pages/`);
docs/layout.md maps them."""

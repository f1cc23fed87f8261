"""Model pairs: presets and loading (`presets`), the embedded pair made from PyPI packages (`embedded`),
its distillation (`distill`), and the prompt sets (`prompts`)."""
from .embedded import (DRAFT_ASSET, EMBEDDED_DRAFT, EMBEDDED_TARGET, ModelError, _gguf_path,  # noqa: F401
                       prepare_embedded_draft, prepare_embedded_target)
from .presets import (PAIRS, QWEN3_SHAPES, Pair, PairConfig, RandomTokenizer, check_tokenizers,  # noqa: F401
                      get_pair_config, load_pair, model_dir, random_model, tokenizer_hash, tokenizer_size)

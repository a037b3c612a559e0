"""The built-in demo: a tiny Qwen3-MoE with a byte-level tokenizer (every UTF-8 byte is a token, plus three
specials), in two versions.

- `demo` is trained on Python's own documentation (`wisp.models.demo_text`) by `wisp.models.demo_training`, and ships
  with the package (`wisp/models/demo_checkpoint/`): it answers in English-like text about Python. Its weights are
  stored as float16 and computed in float32 (`dtype` in its config), so the upcast is exact.
- `demo-random` has the same shape and tokenizer with random weights, written on first use under $WISP_CACHE (default
  ~/.cache/wisp), for tests and benchmarks that want an untrained router (its routing has less locality:
  docs/demo.md).

Both have `DEMO_CONFIG`'s shape; the shipped config equals it (tested), so a test may build either from it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from wisp.models.random_checkpoint import write_random_checkpoint
from wisp.models.source import cache_dir

RANDOM_DEMO_VERSION = "v3"
TRAINED_DEMO = Path(__file__).with_name("demo_checkpoint")
# the trained demo's routing over its held-out text, recorded by wisp (`wisp.bench.perplexity`), shipped beside it
TRAINED_DEMO_ROUTING = TRAINED_DEMO / "routing_held_out.npz"
NAMES = ("demo", "demo-random")
# the trained demo samples by default (`wisp generate` takes these from its generation_config.json): greedy decoding
# of so small a model soon repeats a phrase
TRAINED_DEMO_SAMPLING = {"temperature": 0.8, "top_p": 0.95}
DEMO_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": 259,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": 256,
    "dtype": "float32",
}
DEMO_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, with tools listed in a system turn and calls written as Hermes-style <tool_call> blocks (as Qwen's templates
# do): an assistant turn's tool_calls are rendered back, and a tool's reply goes in a <tool_response> block
DEMO_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou can call these tools. Write each call as <tool_call>\n"
    "{\"name\": ..., \"arguments\": {...}}\n</tool_call>.\n<tools>\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% for c in m.get('tool_calls', []) %}<tool_call>\n{\"name\": \"{{ c['function']['name'] }}\", "
    "\"arguments\": {% if c['function']['arguments'] is string %}{{ c['function']['arguments'] }}"
    "{% else %}{{ c['function']['arguments'] | tojson }}{% endif %}}\n</tool_call>{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer():
    """The demos' tokenizer (`tokenizers.Tokenizer`): byte-level BPE with no merges, so one token a byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(DEMO_SPECIALS)
    return tok


def write_tokenizer_files(path: Path, sampling: dict[str, Any] | None = None) -> None:
    """tokenizer.json, tokenizer_config.json (with the chat template) and generation_config.json (with `sampling`'s
    defaults, if any) into `path`."""
    byte_tokenizer().save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|endoftext|>", "chat_template": DEMO_CHAT_TEMPLATE}, indent=1)
    )
    generation = {"eos_token_id": DEMO_CONFIG["eos_token_id"], **({"do_sample": True, **sampling} if sampling else {})}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=1) + "\n")


def demo_path(name: str = "demo") -> Path:
    """The folder of `name` ("demo": the shipped trained checkpoint; "demo-random": the random one, written
    atomically under `cache_dir()` on first use)."""
    if name == "demo":
        return TRAINED_DEMO
    if name != "demo-random":
        raise ValueError(f"no demo named {name!r}: {NAMES}")
    final = cache_dir() / f"demo-random-{RANDOM_DEMO_VERSION}"
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".demo-", dir=final.parent))
    try:
        write_random_checkpoint(DEMO_CONFIG, tmp, seed=1234)
        write_tokenizer_files(tmp)
        try:
            tmp.rename(final)
        except OSError:  # another process won the race
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final

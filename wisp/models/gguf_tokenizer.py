"""A GGUF file's tokenizer (`tokenizer.ggml.*`) as a Hugging Face `tokenizers` tokenizer, written once into wisp's
cache as tokenizer.json (with tokenizer_config.json: the chat template, the BOS and EOS tokens) so every part of wisp
that opens a tokenizer by its folder (the engine, server workers, the grammar engine) opens this one.

Supported: llama.cpp's "gpt2" model (byte-level BPE from the token list and merges), with the pre-tokenizer split the
file names in `tokenizer.ggml.pre` (`PRE_TOKENIZER_SPLITS`). Control tokens are special (decoding skips them);
user-defined ones (Qwen3's `<think>`, `<tool_call>`) are added tokens matched whole but kept in decoded text, as
the hub's tokenizers keep them. Another tokenizer model, or a split this table does not name, gives no tokenizer
(token ids still work) and says so once: a guessed split would give other token ids than the model was trained on. The cache folder is named by a hash
of the file's path, size and modification time; it is written to a temporary folder and renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from wisp.models.gguf_file import GGUFFile, gguf_parts

log = logging.getLogger(__name__)

# tokenizer.ggml.pre -> the regular expression that splits text before BPE (the published tokenizers' own)
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
PRE_TOKENIZER_SPLITS = {
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "gpt-4o": (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
               r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
               r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""),  # o200k (gpt-oss)
    "gpt-2": GPT2_SPLIT,
    "olmo": GPT2_SPLIT,
    "default": GPT2_SPLIT,
}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types: special tokens, and added tokens kept in text


def build_tokenizer(meta: dict[str, Any]):
    """The `tokenizers.Tokenizer` of a GGUF file's metadata, or None for a tokenizer model other than "gpt2" or a
    pre-tokenizer split `PRE_TOKENIZER_SPLITS` does not name."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "default")
    if kind != "gpt2" or pre not in PRE_TOKENIZER_SPLITS:
        return None
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    types = list(meta.get("tokenizer.ggml.token_type") or [])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, kind in zip(tokens, types) if kind == USER_DEFINED])
    return tok


def tokenizer_config(meta: dict[str, Any]) -> dict[str, Any]:
    """tokenizer_config.json's fields the engine reads: the chat template, the BOS and EOS tokens' text."""
    tokens = meta.get("tokenizer.ggml.tokens") or []
    out: dict[str, Any] = {}
    if meta.get("tokenizer.chat_template"):
        out["chat_template"] = meta["tokenizer.chat_template"]
    for field, key in (("bos_token", "tokenizer.ggml.bos_token_id"), ("eos_token", "tokenizer.ggml.eos_token_id")):
        if isinstance(meta.get(key), int) and 0 <= meta[key] < len(tokens):
            out[field] = tokens[meta[key]]
    return out


def gguf_tokenizer_folder(path: str | Path, cache: Path) -> Path | None:
    """The folder (under `cache`) holding the GGUF file's tokenizer files, written on first use; None when its
    tokenizer model is not supported."""
    first = gguf_parts(path)[0].resolve()  # (the cache key needs no parse of the file's metadata)
    stat = first.stat()
    key = hashlib.sha256(f"{first}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    final = cache / "gguf-tokenizers" / key
    if (final / "tokenizer.json").is_file():
        return final
    meta = GGUFFile(path).metadata
    tok = build_tokenizer(meta)
    if tok is None:
        log.warning("%s: its tokenizer (model %r, pre-tokenizer %r) is not supported (supported: gpt2 with %s); pass "
                    "token ids", first.name, meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre"),
                    ", ".join(PRE_TOKENIZER_SPLITS))
        return None
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tok-", dir=final.parent))
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(meta)))
    try:
        tmp.rename(final)
    except OSError:  # another process wrote it first: theirs stands
        shutil.rmtree(tmp, ignore_errors=True)
    return final

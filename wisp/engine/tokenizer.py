"""Text <-> token ids through the checkpoint's tokenizer.json (Hugging Face `tokenizers`)."""

from __future__ import annotations

from pathlib import Path

from wisp.errors import WispError


class TextTokenizer:
    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self.path = path  # the file: a worker process loads its own copy (wisp.server.prompt_encoder)
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception
            raise WispError(f"{path} is not a valid tokenizer file: {exc}") from None

    @classmethod
    def from_dir(cls, path: Path) -> "TextTokenizer | None":
        file = path / "tokenizer.json"
        return cls(file) if file.is_file() else None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def keeping_special_tokens(self) -> "SpecialTokensKept":
        """This tokenizer as a decoder that writes special tokens' text too (a format whose markers are specials)."""
        return SpecialTokensKept(self._tok)


class SpecialTokensKept:
    def __init__(self, tok):
        self._tok = tok

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def require(tok: TextTokenizer | None, path: Path | None) -> TextTokenizer:
    if tok is None:
        where = path if path is not None else "a model with dummy weights"
        raise WispError(f"{where} has no tokenizer.json: pass token ids (--prompt-ids) instead of text")
    return tok

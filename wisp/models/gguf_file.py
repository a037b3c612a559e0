"""A GGUF checkpoint (llama.cpp's format), one file or split files (`NAME-00001-of-00003.gguf`), read through the
`gguf` package: its metadata as plain values, and its tensors by GGUF name as torch tensors in their logical shape
(outermost dimension first, as the model code indexes them).

A tensor is returned dequantized: float32, float16 and bfloat16 as stored; Q8_0, Q4_K, Q5_K and Q6_K in torch
(`wisp.core.kernels.gguf_blocks`: the `gguf` package's floats); Q4_0-Q5_1, Q2_K, Q3_K and MXFP4 through
`gguf.quants.dequantize` (float32, exact for every block format). Any other type is a WispError
naming the supported ones. `packed` gives a tensor's stored bytes instead (GPT-OSS's MXFP4 experts stay packed).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wisp.core.kernels.gguf_blocks import BLOCKS as TORCH_BLOCKS
from wisp.core.kernels.gguf_blocks import dequantize as dequantize_blocks
from wisp.errors import WispError

SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


def is_gguf(path: str | Path) -> bool:
    return str(path).endswith(".gguf")


def gguf_parts(path: str | Path) -> list[Path]:
    """The files of a GGUF checkpoint: `path` alone, or every part of the split set it names (any part may be given)."""
    path = Path(path).expanduser()
    m = SPLIT_NAME.match(path.name)
    if m is None:
        if not path.is_file():
            raise WispError(f"GGUF file {path} does not exist")
        return [path]
    count = int(m["count"])
    parts = [path.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise WispError(f"GGUF split set {m['stem']} has {count} parts; missing: {', '.join(missing)}")
    return parts


def _quant_types():
    import gguf

    q = gguf.GGMLQuantizationType
    return {q.F32: np.float32, q.F16: np.float16, q.BF16: None}, (
        q.Q8_0, q.Q4_0, q.Q4_1, q.Q5_0, q.Q5_1, q.Q2_K, q.Q3_K, q.Q4_K, q.Q5_K, q.Q6_K, q.MXFP4)


class GGUFFile:
    """The metadata and tensors of one GGUF checkpoint (all its split parts)."""

    def __init__(self, path: str | Path):
        import gguf

        self.parts = gguf_parts(path)
        readers = []
        for part in self.parts:
            try:
                readers.append(gguf.GGUFReader(part))
            except (ValueError, OSError, IndexError) as exc:
                raise WispError(f"{part} is not a readable GGUF file ({exc})") from None
        self.metadata: dict[str, Any] = {name: field.contents() for name, field in readers[0].fields.items()
                                         if not name.startswith("GGUF.")}
        self._tensors = {t.name: t for reader in readers for t in reader.tensors}
        self.arch = str(self.metadata.get("general.architecture", ""))

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value, `key` relative to the architecture's namespace (`block_count` -> `qwen3moe.block_count`),
        or a full key (`tokenizer.ggml.tokens`)."""
        return self.metadata.get(f"{self.arch}.{key}", self.metadata.get(key, default))

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def tensor_type(self, name: str) -> str | None:
        """The GGML type's name of tensor `name` (e.g. "MXFP4"), None when the file has no such tensor."""
        return self._tensors[name].tensor_type.name if name in self._tensors else None

    def tensor_shape(self, name: str) -> tuple[int, ...] | None:
        """Tensor `name`'s logical shape (outermost first), None when the file has no such tensor."""
        return tuple(int(d) for d in reversed(self._tensors[name].shape)) if name in self._tensors else None

    def expert_facts(self) -> dict[str, Any]:
        """What the config needs from the tensors themselves: the experts' GGML type and width (from the first
        stacked experts), the types of each layer's (gate, up, down) and of all of them, the shared expert's
        width (0: none), and the sizes of the dense projections in a block format that can stay packed."""
        first = next((n for n in self._tensors if n.endswith(".ffn_gate_exps.weight")), None)
        shared = next((n for n in self._tensors if n.endswith(".ffn_gate_shexp.weight")), None)
        experts = [n for n in self._tensors if n.endswith(("_exps.weight"))]
        layers = {int(n.split(".")[1]) for n in experts if n.startswith("blk.")}
        layer_types = {i: tuple(self.tensor_type(f"blk.{i}.ffn_{r}_exps.weight") for r in ("gate", "up", "down"))
                       for i in sorted(layers)}
        return {"type": self.tensor_type(first) if first else None,
                "types": {t for roles in layer_types.values() for t in roles},  # every layer's gate, up and down experts'
                "layer_types": layer_types,
                "width": self.tensor_shape(first)[1] if first else None,
                "projections": self.projection_facts(TORCH_BLOCKS),  # what of them can stay packed
                "shared_width": self.tensor_shape(shared)[0] if shared else 0}

    def projection_facts(self, packed_types) -> dict[str, tuple[int, int]]:
        """(parameters, bytes as stored) of the dense weights whose GGML type is one of `packed_types` (what stays
        packed of them, as the loader's projections): "attention", every layer's q, k, v and output; "other", the
        shared experts', the dense layers' MLPs and the LM head (output)."""
        def sizes(suffixes: tuple[str, ...], extra: tuple[str, ...] = ()) -> tuple[int, int]:
            kept = [t for n, t in self._tensors.items() if (n in extra or (n.startswith("blk.") and n.endswith(suffixes)))
                    and self.tensor_type(n) in packed_types]
            return sum(int(t.n_elements) for t in kept), sum(int(t.n_bytes) for t in kept)

        return {"attention": sizes((".attn_q.weight", ".attn_k.weight", ".attn_v.weight", ".attn_output.weight")),
                "other": sizes(tuple(f".ffn_{p}{s}.weight" for p in ("gate", "up", "down") for s in ("_shexp", "")),
                               extra=("output.weight",))}

    def packed(self, name: str) -> torch.Tensor:
        """Tensor `name`'s stored bytes, uint8 [outer..., bytes of one innermost row] (a block format's blocks)."""
        return torch.from_numpy(np.asarray(self._tensors[name].data).view(np.uint8).copy())

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor `name` [outermost, ..., innermost], dequantized (float32 for the block formats)."""
        import gguf

        t = self._tensors[name]
        plain, blocks = _quant_types()
        data = np.asarray(t.data)
        if t.tensor_type in plain:
            if t.tensor_type == gguf.GGMLQuantizationType.BF16:
                shape = tuple(int(d) for d in reversed(t.shape))
                return torch.from_numpy(data.view(np.uint16).reshape(shape).copy()).view(torch.bfloat16)
            return torch.from_numpy(data.astype(plain[t.tensor_type], copy=True))
        if t.tensor_type.name in TORCH_BLOCKS:  # in torch (the same floats; numpy's is slow at 30B weights)
            return dequantize_blocks(torch.from_numpy(np.array(data, copy=True).view(np.uint8)), t.tensor_type.name)
        if t.tensor_type in blocks:
            return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(data, t.tensor_type)))
        names = ", ".join(q.name for q in (*plain, *blocks))
        raise WispError(f"tensor {name} is {t.tensor_type.name}, which wisp does not read; supported: {names}")

"""The names of an expert bank's two weight tensors, the one home of these keys.

A bank is a dict of tensors, every one [N, ...] (one row per expert): `GATE_UP` the fused gate and up
projection, `DOWN` the down projection; a quantized bank adds its scales and biases beside them under the
names `wisp.core.kernels.expert_extras` reads. Loaders fill banks under these keys, stores and kernels read them.
"""

GATE_UP, DOWN = "gate_up", "down"


def layout_key(bank: dict) -> tuple:
    """What tells experts laid out alike: each tensor's name, per-expert shape and dtype (a GGUF file's layers may keep
    their experts in different block formats; every other model's layers share one layout)."""
    return tuple((name, tuple(t.shape[1:]), t.dtype) for name, t in bank.items())

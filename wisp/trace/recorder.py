"""RoutingRecorder: capture the routed experts of every token, per engine step and MoE layer.

Attach with `recorder.attach(engine)`: it registers as a routing observer on the engine's `ModelRunner`,
which calls `begin_step()` before each step's forward and `record(layer, topk_ids, topk_weights)` from
every MoE layer. `trace()` returns a `RoutingTrace` whose tokens are in processing order with `step`
marking which tokens were computed together (a prefill chunk, or one batched decode step, or both in
one step). Those are the pager's steps at every C: a step wider than C runs expert-major as one step
(`wisp.core.experts.expert_major`). While attached, decode runs eagerly (the runner replays no CUDA graph: an
observer needs the routing on the host). Recording reads the routing back to the host every layer: it is for traces, not for speed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import numpy as np
import torch

from wisp.errors import WispError
from wisp.trace.format import RoutingTrace


class RoutingRecorder:
    def __init__(self, moe_layers: list[int], num_experts: int, model_name: str = ""):
        self.layers = list(moe_layers)
        self.num_experts = num_experts
        self.model_name = model_name
        self._pos = {layer: i for i, layer in enumerate(self.layers)}
        self._steps: list[tuple[np.ndarray, np.ndarray]] = []  # per step: ids [n, L, K], weights [n, L, K]
        self._current: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._handle = None  # while attached: the runner's registration

    def begin_step(self) -> None:
        self._flush()

    def record(self, layer: int, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
        self._current[layer] = (topk_ids.to(torch.int16).cpu().numpy(), topk_weights.float().cpu().numpy())

    def _flush(self) -> None:
        if not self._current:
            return
        n, k = next(iter(self._current.values()))[0].shape
        ids = np.full((n, len(self.layers), k), -1, dtype=np.int16)
        weights = np.zeros((n, len(self.layers), k), dtype=np.float32)
        for layer, (i, w) in self._current.items():
            ids[:, self._pos[layer]], weights[:, self._pos[layer]] = i, w
        self._steps.append((ids, weights))
        self._current = {}

    def trace(self) -> RoutingTrace:
        self._flush()
        if not self._steps:
            raise ValueError("nothing was recorded")
        ids = np.concatenate([s[0] for s in self._steps])
        weights = np.concatenate([s[1] for s in self._steps])
        step = np.concatenate([np.full(len(s[0]), i, dtype=np.int32) for i, s in enumerate(self._steps)])
        meta = {"model": self.model_name, "note": "recorded by wisp"}
        return RoutingTrace(ids, weights, step, self.layers, self.num_experts, meta)

    def attach(self, engine) -> "RoutingRecorder":
        self._handle = engine.runner.add_routing_observer(self)
        return self

    def detach(self, engine) -> None:
        """Undo `attach`: the engine runs unrecorded again (what was recorded stays readable)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def check_trace_path(path: str, flag: str = "--record-routing") -> None:
    """Fail before a run (one WispError) unless `path` names a .npz or .jsonl file in a writable folder."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise WispError(f"cannot write the routing trace: {folder} is not a writable directory")
    if not str(path).endswith((".npz", ".jsonl")):
        raise WispError(f"{flag} {path}: the file name must end in .npz or .jsonl")


def recorder_for(engine, model_name: str, path: str) -> RoutingRecorder:
    """A routing recorder attached to `engine`, after `check_trace_path(path)`."""
    check_trace_path(path)
    cfg = engine.model_config
    return RoutingRecorder(cfg.moe_layer_ids, cfg.num_experts, model_name).attach(engine)


def save_trace(make_trace: Callable[[], RoutingTrace], path: str) -> None:
    """Write the trace `make_trace()` gives. A write that fails (a full disk, ENOSPC; the folder gone) loses the trace
    alone: one warning line, no partial file (`RoutingTrace.save`), and the command's output and exit status stand:
    generation and serving are not failed for a side output."""
    try:
        make_trace().save(path)
    except ValueError:
        print("wisp: no routing was recorded (no request ran); nothing written", file=sys.stderr)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        print(f"wisp: warning: the routing trace was not written to {path} ({reason}); it is lost, and no partial "
              "file was left", file=sys.stderr)

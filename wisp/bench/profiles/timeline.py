"""`wisp bench profile timeline`: where a rank-share decode step's time goes, read from a Chrome trace of
`wisp bench profile steps --trace`.

A rank-share step (hybrid with no slots under CUDA graphs, `PiecesWithCpuRanks.replay`) alternates, per MoE layer, the
CPU's experts on the host and a serial piece: the CPU's rows copied to the device, the merge, the next layer's
attention and router, the routing's copy to the host and the host waking on it. The host's CUDA calls mark the
layers: the first call after a wait on an event (`cudaEventSynchronize`, the routing's) that comes at least
150 us later (the CPU's experts between) is the CPU done: the next piece's launch, which copies the rows in
and merges (or, before that was one graph, the rows' `cudaMemcpyAsync`). Per layer-step this prints, in us (means):
- cpu: from the routing's arrival on the host to the CPU's rows done;
- serial: from the CPU's rows done to the next layer's routing on the host, split into
  - to_gpu: until the rows' copy starts on the device (behind the GPU's own pairs, when those run late),
  - gpu_busy / gpu_idle: the device's kernels and copies until the routing's copy ends, and its gaps,
  - wake: from that copy's end to the host returning from its wait;
and the kernels of the serial piece by mean time a layer, and the step boundary (the last layer's serial part,
the engine's work between steps included) apart.

    wisp bench profile timeline share_steps.json
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from wisp.errors import WispError

RUNTIME = ("cuda_runtime", "cuda_driver")
QUERIES = ("cudaStreamIsCapturing", "cudaEventQuery", "INVALID")  # host calls that launch nothing
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")


def _end(e: dict) -> float:
    return e["ts"] + e.get("dur", 0.0)


def _busy(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) spans."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def layer_steps(events: list[dict], min_cpu_us: float = 150.0) -> list[dict]:
    """One dict per layer-step (the host's CPU time, then the serial piece after it), in order."""
    host = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in RUNTIME and e["name"] not in QUERIES),
                  key=lambda e: e["ts"])
    device = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE), key=lambda e: e["ts"])
    on_device = defaultdict(list)
    for e in device:
        on_device[e.get("args", {}).get("correlation")].append(e)
    marks = []  # (the host's first call after the CPU's rows, the routing's wait before it)
    for before, e in zip(host, host[1:]):
        if (before["name"] == "cudaEventSynchronize" and e["name"] in ("cudaMemcpyAsync", "cudaGraphLaunch")
                and e["ts"] - _end(before) >= min_cpu_us):  # not a sync before a plain copy (the step's inputs)
            marks.append((e, before))
    layers = []
    for (copy, routed), (_, next_routed) in zip(marks, marks[1:]):
        landed = on_device.get(copy.get("args", {}).get("correlation"), [])
        start = landed[0]["ts"] if landed else copy["ts"]
        resumed = _end(next_routed)
        window = [e for e in device if e["ts"] >= start and _end(e) <= resumed]
        to_host = [e for e in window if "DtoH" in e["name"] or "Device -> Pinned" in e["name"]]
        arrived = _end(to_host[-1]) if to_host else resumed
        spans = [(e["ts"], _end(e)) for e in window if _end(e) <= arrived]
        busy = _busy(spans)
        layers.append({"cpu": copy["ts"] - _end(routed), "serial": resumed - copy["ts"], "to_gpu": start - copy["ts"],
                       "gpu_busy": busy, "gpu_idle": max(0.0, arrived - start - busy), "wake": resumed - arrived,
                       "kernels": [(e["name"], e.get("dur", 0.0)) for e in window if _end(e) <= arrived]})
    return layers


def read_events(path: str) -> list[dict]:
    """A Chrome trace's events; an unreadable file or one without events is one WispError line."""
    try:
        return json.loads(Path(path).read_text())["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WispError(f"{path} is not a Chrome trace with traceEvents ({type(exc).__name__}: {exc})") from None


def share_timeline(args) -> list[dict]:
    """`wisp bench profile timeline`: the layer-steps' means inside steps and at step boundaries, and the
    serial piece's kernels, printed; the layer-steps returned."""
    events = read_events(args.trace)
    layers = layer_steps(events)
    if not layers:
        raise WispError("no rank-share layer-steps in this trace (a hybrid --cap 0 --graphs profile?)")
    usual = statistics.median(x["serial"] for x in layers)
    inner = [x for x in layers if x["serial"] < 3 * usual]
    bounds = [x for x in layers if x["serial"] >= 3 * usual]
    keys = ("cpu", "serial", "to_gpu", "gpu_busy", "gpu_idle", "wake")
    print(f"{len(inner)} layer-steps inside steps, {len(bounds)} step boundaries; means in us")
    print("inside: " + ", ".join(f"{k} {statistics.mean(x[k] for x in inner):.1f}" for k in keys))
    if bounds:
        print("boundary: " + ", ".join(f"{k} {statistics.mean(x[k] for x in bounds):.1f}" for k in keys))
    per_name = defaultdict(float)
    for x in inner:
        for name, dur in x["kernels"]:
            per_name[name[:90]] += dur / len(inner)
    print(f"serial piece's device work a layer-step (us, {sum(per_name.values()):.1f} in all):")
    for name, us in sorted(per_name.items(), key=lambda kv: -kv[1])[: args.rows]:
        print(f"  {us:8.2f}  {name}")
    return layers

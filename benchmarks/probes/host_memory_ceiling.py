"""Question: how fast can host RAM feed experts to the CPU and the GPU at once? The ceiling of any CPU + GPU
split.

Asked: 2026-12-01.

Answer (benchmarks/results/logs/host_memory_ceiling_h200_*.json; docs/hybrid.md): on the H200 hosts, 124-142
GB/s together. Host S: the CPU alone 98.9 GB/s and 93.9 beside pinned copies, the copies 54.3 alone and 48.3
beside the CPU, 142.1 together; host K 123.8 together (87.1 CPU alone). So at OLMoE's 1.61 GB of experts a
token the experts alone take 11.9-13.0 ms a token at the ceiling, however the split is made.

A decode step that computes some experts on the CPU (reading host RAM) while the GPU reads or copies the
others over PCIe is bounded by what host memory serves to both at once. This measures, on the machine it
runs on:
- host_read_gbps: all torch threads summing a pinned buffer (a plain read, no kernel of ours), alone;
- h2d_gbps: pinned host -> device copies on a copy stream, alone (CUDA only);
- the two started together: each one's rate while the other runs (the CPU reads again and again until the
  queued copies are done), and their sum.
`--peer-gbps X --target Y` adds the verdict for a peer that reads X GB/s of experts (llama.cpp all-CPU on
OLMoE at 39.5 tok/s x 1.61 GB a token: about 63.6) and a target of Y times its speed: whether the combined
rate clears X * Y, the most a perfect split could reach.

    python benchmarks/probes/host_memory_ceiling.py --gb 4 --peer-gbps 63.6 --target 1.5 --out ceiling.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from wisp.bench.records import print_and_save


def read_seconds(buf: torch.Tensor) -> float:
    start = time.perf_counter()
    buf.sum()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=4.0, help="size of the buffer the CPU reads (and of the copy source)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--peer-gbps", type=float, default=None)
    ap.add_argument("--target", type=float, default=1.5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    n = int(args.gb * 2**30) // 4
    buf = torch.ones(n, dtype=torch.float32, pin_memory=cuda)  # [n] the CPU's reads
    nbytes = buf.numel() * 4
    read_seconds(buf)
    rec = {"threads": torch.get_num_threads(), "gb": nbytes / 1e9,
           "host_read_gbps": nbytes / statistics.median(read_seconds(buf) for _ in range(args.repeats)) / 1e9}
    if cuda:
        src = torch.ones(n, dtype=torch.float32, pin_memory=True)  # a second buffer: the copies' source
        dst = torch.empty(n, dtype=torch.float32, device="cuda")
        copy_stream = torch.cuda.Stream()

        def copies(times: int) -> tuple[torch.cuda.Event, torch.cuda.Event]:
            with torch.cuda.stream(copy_stream):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record(copy_stream)
                for _ in range(times):
                    dst.copy_(src, non_blocking=True)
                end.record(copy_stream)
            return start, end

        start, end = copies(1)
        torch.cuda.synchronize()
        alone = []
        for _ in range(args.repeats):
            start, end = copies(1)
            end.synchronize()
            alone.append(start.elapsed_time(end) / 1e3)
        rec["h2d_gbps"] = nbytes / statistics.median(alone) / 1e9
        cpu_during, copy_during = [], []
        for _ in range(args.repeats):
            start, end = copies(3)  # queued first: the DMA engine runs them while this thread reads, again and
            began, reads = time.perf_counter(), 0  # again until they are done, so both span the same window
            while reads == 0 or not end.query():
                buf.sum()
                reads += 1
            cpu_during.append(reads * nbytes / (time.perf_counter() - began))
            end.synchronize()
            copy_during.append(3 * nbytes / (start.elapsed_time(end) / 1e3))
        rec["host_read_gbps_during_copy"] = statistics.median(cpu_during) / 1e9
        rec["h2d_gbps_during_read"] = statistics.median(copy_during) / 1e9
        rec["combined_gbps"] = rec["host_read_gbps_during_copy"] + rec["h2d_gbps_during_read"]
        rec["gpu"] = torch.cuda.get_device_name()
    if args.peer_gbps and "combined_gbps" in rec:
        need = args.peer_gbps * args.target
        rec["verdict"] = {"peer_gbps": args.peer_gbps, "target": args.target, "needed_gbps": need,
                          "reachable": rec["combined_gbps"] >= need}
    print_and_save(rec, args.out)


if __name__ == "__main__":
    main()

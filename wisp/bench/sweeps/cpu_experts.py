"""`wisp bench sweep cpu-experts`: how fast each hybrid CPU kernel computes experts, alone and while the GPU
reads other experts in place or copies them.

Hybrid mode with no slots splits a decode step's experts between the CPU (`wisp.core.kernels.cpu_expert_kernels`)
and the GPU's kernel reading the rest straight from the same pinned host memory, so an expert that the CPU
computes fast alone can be slow inside a step (docs/hybrid.md). This separates the suspects: for each kernel
and thread count it times one expert at `--rows` rows, cycling over the bank so no cache helps (GB/s of
weights read, median), alone and, on CUDA, while another stream keeps the Triton MoE kernel reading the other
half of the experts in place (`pairs_by_map`, top-k of them a launch), and while it copies them to the GPU
instead (pinned cudaMemcpyAsync); each side's rate alone is reported too.

    wisp bench sweep cpu-experts --threads 16,8 --out cpu_expert_kernels.json
    wisp bench sweep cpu-experts --kernels native --per-call 1,2,4,8 --bank pinned,huge --out calls.json
    wisp bench sweep cpu-experts --weights bf16,fp8,q8_0 --hidden 2048 --intermediate 768 --out formats.json

`--weights` adds banks of quantized experts (FP8 blocks, MXFP4, Q8_0: random codes, pinned), timed alone: the
native kernel reads them packed, "plain" dequantizes each expert with torch first (hybrid's CPU side before the
native kernel read them); GB/s there counts the packed bytes, codes and scales.

`--per-call` lists how many distinct experts one call computes (a rank split hands a layer's CPU share to one
native call: the rates at 1, 2, 4, 8 give a call's fixed cost apart from its cost an expert); `--bank huge`
allocates the bank in 2 MB transparent huge pages and pins it with cudaHostRegister instead of cudaHostAlloc
(fewer TLB misses per expert read, where the kernel backs them with huge pages: the record says how much of the
bank is, from /proc/meminfo's AnonHugePages).
"""

from __future__ import annotations

import mmap
import statistics
import time

import torch

from wisp.bench.records import print_and_save
from wisp.core.bank_keys import DOWN, GATE_UP
from wisp.core.kernels.cpu_expert_kernels import CPU_EXPERT_KERNELS, native_kernel_error
from wisp.core.kernels.expert_extras import DOWN_SCALE, GATE_UP_SCALE, extras_at, extras_of
from wisp.core.kernels.k_quants import bank_shapes as k_quant_shapes
from wisp.errors import WispError
from wisp.models.random_checkpoint import random_k_quant_heads

WEIGHTS = ("bf16", "fp8", "mxfp4", "q8_0", "q4_k", "q5_k", "q6_k")  # --weights: the bank's format (quantized: read
# packed by "native")


def expert_rate(kernel, bank: dict[str, torch.Tensor], experts: range, rows: int, repeats: int,
                per_call: int = 1) -> float:
    """GB/s of weights a call of `per_call` distinct experts reads (as a rank split hands a layer's CPU share
    to one native call), the median over `repeats` calls on experts in turn."""
    d = bank[DOWN].shape[1]
    x = torch.randn((rows * per_call, d)).to(torch.bfloat16 if GATE_UP_SCALE in bank else bank[GATE_UP].dtype)
    nbytes = per_call * sum(t[0].nbytes for t in bank.values())
    extras = extras_of(bank)
    times = []
    for i in range(repeats + 3):
        es = [experts[(i * 7 + j * 13) % len(experts)] for j in range(per_call)]  # distinct: 13 is prime to the bank
        start = time.perf_counter()
        kernel(x, [rows] * per_call, [bank[GATE_UP][e] for e in es], [bank[DOWN][e] for e in es],
               [extras_at(extras, e) for e in es])
        if i >= 3:  # three warm-ups
            times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def huge_page_bank(shape: tuple[int, ...], dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """An uninitialised tensor in anonymous memory advised to transparent huge pages (2 MB aligned), pinned
    in place with cudaHostRegister when `pin` (mapped at the same address on GPUs that can use host pointers
    for registered memory: the record's `host_pointer_ok`)."""
    huge = 2 << 20
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    area = mmap.mmap(-1, nbytes + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    area.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(area, dtype=torch.uint8)  # holds `area` alive
    skip = -raw.data_ptr() % huge
    tensor = raw[skip: skip + nbytes].view(dtype).view(shape)
    tensor.zero_()  # fault the pages in (as huge pages where the kernel grants them) before pinning
    if pin:
        code = torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), nbytes, 0)
        if int(code) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {code}")
    return tensor


def quantized_bank(weights: str, n: int, d: int, i: int, pin: bool) -> dict[str, torch.Tensor]:
    """A bank of n experts in `weights` (fp8, mxfp4, q8_0, or a k-quant) with random codes and plausible scales,
    pinned when `pin` (timing only: the values do not matter to the kernels' speed, but none is a NaN)."""
    def codes_and_scales(rows: int, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        if weights == "fp8":
            codes = torch.randint(0, 0x7F, (n, rows, depth), dtype=torch.uint8)  # no NaN (0x7F)
            codes |= torch.randint(0, 2, (n, rows, depth), dtype=torch.uint8) << 7
            return codes.view(torch.float8_e4m3fn), torch.rand((n, -(-rows // 128), -(-depth // 128))) * 1e-3
        if weights == "mxfp4":
            return (torch.randint(0, 256, (n, rows, depth // 32, 16), dtype=torch.uint8),
                    torch.randint(110, 125, (n, rows, depth // 32), dtype=torch.uint8))
        if weights in ("q4_k", "q5_k", "q6_k"):
            codes, heads = k_quant_shapes(rows, depth, weights.upper())
            return (torch.randint(0, 256, (n, *codes), dtype=torch.uint8),
                    random_k_quant_heads((n, *heads), 0.05, torch.Generator().manual_seed(0), "cpu"))
        return (torch.randint(-127, 128, (n, rows, depth), dtype=torch.int8),
                (torch.rand((n, rows, depth // 32)) * 1e-3).half())

    (gate_up, gate_up_scale), (down, down_scale) = codes_and_scales(2 * i, d), codes_and_scales(d, i)
    bank = {GATE_UP: gate_up, DOWN: down, GATE_UP_SCALE: gate_up_scale, DOWN_SCALE: down_scale}
    return {key: t.pin_memory() if pin else t for key, t in bank.items()}


def anon_huge_bytes() -> int:
    """/proc/meminfo's AnonHugePages in bytes (0 where there is none)."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class InPlaceReads:
    """The GPU's side of a no-slot hybrid step, on a loop: the Triton kernel reading `top_k` experts of
    `experts` in place per launch, on its own stream, until stopped."""

    def __init__(self, bank: dict[str, torch.Tensor], experts: range, top_k: int):
        from wisp.core.kernels.registry import moe_kernels

        self.bank, self.kernels = bank, moe_kernels("triton")
        d, n = bank[DOWN].shape[1], bank[GATE_UP].shape[0]
        self.hidden = torch.randn((1, d), device="cuda").to(bank[GATE_UP].dtype)
        self.ids = torch.tensor([[experts[i % len(experts)] for i in range(top_k)]], device="cuda")
        self.expert_map = torch.arange(n, dtype=torch.int32, device="cuda")
        self.out = torch.zeros((top_k, d), dtype=torch.float32, device="cuda")
        self.stream = torch.cuda.Stream()
        self.nbytes = top_k * (bank[GATE_UP][0].nbytes + bank[DOWN][0].nbytes)

    def launch(self, times: int) -> None:
        with torch.cuda.stream(self.stream):
            for _ in range(times):
                self.kernels.pairs_by_map(self.out, self.hidden, self.bank[GATE_UP], self.bank[DOWN], self.ids,
                                          self.expert_map)

    def rate(self, launches: int) -> float:
        """GB/s it reads over `launches` launches (of `nbytes` each)."""
        self.stream.synchronize()
        start = time.perf_counter()
        self.launch(launches)
        self.stream.synchronize()
        return launches * self.nbytes / (time.perf_counter() - start) / 1e9


class PinnedCopies(InPlaceReads):
    """The link busy the other way a step could use it: plain copies of `top_k` experts' weights from the
    pinned bank to the GPU per launch (cudaMemcpyAsync, as paged mode's slot loads), on its own stream."""

    def __init__(self, bank: dict[str, torch.Tensor], experts: range, top_k: int):
        super().__init__(bank, experts, top_k)
        self.targets = [(bank[GATE_UP][0].to("cuda"), bank[DOWN][0].to("cuda")) for _ in range(top_k)]
        self.sources = [experts[i % len(experts)] for i in range(top_k)]

    def launch(self, times: int) -> None:
        with torch.cuda.stream(self.stream):
            for _ in range(times):
                for (gate_up, down), e in zip(self.targets, self.sources):
                    gate_up.copy_(self.bank[GATE_UP][e], non_blocking=True)
                    down.copy_(self.bank[DOWN][e], non_blocking=True)


def sweep_cpu_experts(args) -> dict:
    """`wisp bench sweep cpu-experts`: every bank kind, experts a call, thread count and kernel; the record,
    printed and written to `--out` when given."""
    threads_to_try = args.threads or [torch.get_num_threads()]
    cuda = torch.cuda.is_available()
    n, d, i = args.experts, args.hidden, args.intermediate
    kernels = [k for k in CPU_EXPERT_KERNELS if k != "native" or native_kernel_error() is None]
    if args.kernels:
        unknown = [k for k in args.kernels.split(",") if k not in CPU_EXPERT_KERNELS]
        if unknown:
            raise WispError(f"unknown CPU kernel {unknown[0]!r}; choose from {', '.join(CPU_EXPERT_KERNELS)}")
        kernels = [k for k in args.kernels.split(",") if k in kernels]
    rec = {"shape": {"hidden": d, "intermediate": i, "experts": n, "rows": args.rows}, "cpu_kernels": kernels,
           "native_error": native_kernel_error(), "gpu": torch.cuda.get_device_name() if cuda else None,
           "threads_available": torch.get_num_threads(), "banks": {}}
    if cuda:
        rec["host_pointer_ok"] = bool(torch.cuda.get_device_properties(0).can_use_host_pointer_for_registered_mem
                                      if hasattr(torch.cuda.get_device_properties(0), "can_use_host_pointer_for_registered_mem")
                                      else None)
    banks = args.bank.split(",")
    if set(banks) - {"pinned", "huge"}:
        raise WispError(f"--bank {args.bank}: comma-separated pinned, huge")
    weights = args.weights.split(",")
    if set(weights) - set(WEIGHTS):
        raise WispError(f"--weights {args.weights}: comma-separated {', '.join(WEIGHTS)}")
    banks = [*(banks if "bf16" in weights else []), *(w for w in weights if w != "bf16")]
    for kind in banks:
        before = anon_huge_bytes()
        if kind in WEIGHTS:  # a quantized bank: the CPU's rates alone (the GPU's readers take bf16 banks)
            bank = quantized_bank(kind, n, d, i, cuda)
        elif kind == "huge":
            bank = {GATE_UP: huge_page_bank((n, 2 * i, d), torch.bfloat16, cuda),
                    DOWN: huge_page_bank((n, d, i), torch.bfloat16, cuda)}
        else:
            bank = {GATE_UP: torch.empty((n, 2 * i, d), dtype=torch.bfloat16, pin_memory=cuda),
                    DOWN: torch.empty((n, d, i), dtype=torch.bfloat16, pin_memory=cuda)}
        if kind not in WEIGHTS:
            for t in bank.values():
                t.uniform_(-3 ** 0.5 / d ** 0.5, 3 ** 0.5 / d ** 0.5)  # in place: a bank of many GB fills in seconds
        rec["banks"][kind] = runs = {"anon_huge_bytes": anon_huge_bytes() - before,
                                     "bank_bytes": sum(t.nbytes for t in bank.values())}
        cpu_experts, gpu_experts = range(n // 2), range(n // 2, n)
        gpu_readers = {"in_place": InPlaceReads(bank, gpu_experts, args.top_k),
                       "pinned_copies": PinnedCopies(bank, gpu_experts, args.top_k)} if cuda and kind not in WEIGHTS else {}
        for name, reader in gpu_readers.items():
            reader.rate(5)  # compiles the kernel, warms the copies
            runs[f"gpu_{name}_gbps_alone"] = round(reader.rate(50), 1)
        for per_call in args.per_call:
            for threads in threads_to_try:
                torch.set_num_threads(threads)
                run = runs[f"{per_call}_per_call/{threads}_threads"] = {"alone": {}}
                run["alone"] = {k: round(expert_rate(CPU_EXPERT_KERNELS[k], bank, cpu_experts, args.rows,
                                                     args.repeats, per_call), 1) for k in kernels}
                for name, reader in gpu_readers.items():
                    beside, launch_s = {}, reader.nbytes / (runs[f"gpu_{name}_gbps_alone"] * 1e9)
                    for k in kernels:  # enough launches to outlast the CPU's calls four times over
                        cpu_s = ((args.repeats + 3) * per_call * (bank[GATE_UP][0].nbytes + bank[DOWN][0].nbytes)
                                 / (run["alone"][k] * 1e9))
                        reader.launch(int(4 * cpu_s / launch_s) + 10)
                        beside[k] = round(expert_rate(CPU_EXPERT_KERNELS[k], bank, cpu_experts, args.rows,
                                                      args.repeats, per_call), 1)
                        torch.cuda.synchronize()
                    run[f"beside_gpu_{name}"] = beside
                print(kind, per_call, threads, run, flush=True)
        del gpu_readers, bank
    print_and_save(rec, args.out)
    return rec

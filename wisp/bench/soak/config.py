"""What one soak runs: its length, its traffic, the server it starts (`SoakConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SoakConfig:
    """One soak: `seconds` of traffic (or `max_requests`) from `concurrency` clients against `wisp serve --model
    model ...` (its own limits, `server_args` appended), resizes every `resize_every` s, probes every
    `probe_every` s, RSS every `rss_every` s."""

    seconds: float = 60.0
    max_requests: int = 1_000_000
    concurrency: int = 8
    model: str = "demo"
    device: str = "cpu"
    load_format: str = "auto"
    mode: str = "paged"
    max_concurrency: int = 8
    max_model_len: int = 512
    max_num_batched_tokens: int = 64
    max_tokens: tuple[int, int] = (2, 24)  # completion lengths drawn from this range
    bad_fraction: float = 0.1
    resize_every: float = 10.0
    resize_caps: list[int] | None = None  # None: around the start cap (halved, doubled, ...), clipped at start
    probe_every: float = 10.0
    probe_tokens: int = 24
    rss_every: float = 1.0
    warmup_fraction: float = 0.2
    seed: int = 0
    server_args: list[str] = field(default_factory=list)
    startup_timeout: float = 900.0
    log: str | None = None  # the server's output; default: next to --out, else a temp file

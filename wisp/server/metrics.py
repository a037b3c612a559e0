"""Prometheus metrics of one server, in their own `CollectorRegistry` (never the process-global one).

Engine counters and gauges come from the engine's stats snapshot, **refreshed when scraped**: the /metrics
route first awaits `AsyncEngine.refresh_stats()`, which asks the engine thread for a new snapshot between two
steps and waits for it (up to `STATS_TIMEOUT_S`, 2 s, behind a long step; then the previous snapshot is
served). The engine thread never reads its device counters per step: only for a scrape, and once each time it
goes idle (so an idle server's stats are exact). `wisp_stats_age_seconds` says how old the served snapshot
is (about 0 unless a scrape timed out). Latency histograms and request counters are fed by the engine thread
through the `RequestObserver` methods (prometheus_client metrics are thread-safe).
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# engine stats key -> (metric family name, help); counters get the `_total` suffix on exposition
COUNTERS = {
    "expert_hits": ("wisp_expert_hits", "Routed experts that were already resident on the device."),
    "expert_misses": ("wisp_expert_misses", "Routed experts that were not resident on the device."),
    "expert_evictions": ("wisp_expert_evictions", "Resident experts displaced to make room."),
    "expert_loads": ("wisp_expert_loads", "Experts copied host -> device."),
    "expert_cpu_computed": ("wisp_expert_cpu_computed", "Missing experts computed on the CPU, not copied (hybrid mode)."),
    "bytes_h2d": ("wisp_expert_bytes_h2d", "Expert bytes copied host -> device."),
    "prefix_hit_tokens": ("wisp_prefix_cache_hit_tokens", "Prompt tokens served from the KV prefix cache."),
    "prefix_miss_tokens": ("wisp_prefix_cache_miss_tokens", "Prompt tokens that had to be prefilled."),
    "preemptions": ("wisp_preemptions", "Running requests preempted to free KV blocks."),
}
GAUGES = {
    "hit_rate": ("wisp_expert_hit_rate", "Expert hits / (hits + misses) since start."),
    "kv_blocks_total": ("wisp_kv_blocks_capacity", "KV blocks in the pool."),
    "kv_blocks_used": ("wisp_kv_blocks_used", "KV blocks held by running requests."),
    "kv_blocks_cached": ("wisp_kv_blocks_cached", "Free KV blocks still holding a reusable cached prefix."),
    "kv_blocks_free": ("wisp_kv_blocks_free", "KV blocks holding nothing."),
    "kv_peak_blocks_used": ("wisp_kv_blocks_used_peak", "Most KV blocks in use at once since start."),
    "admission_floor_blocks": ("wisp_kv_admission_floor_blocks", "KV blocks the pool never goes below (W x L)."),
    "expert_cap": ("wisp_expert_cap", "Expert slots per MoE layer (the largest, with uneven caps)."),
    "num_running": ("wisp_requests_running", "Requests in the running batch."),
    "num_waiting": ("wisp_requests_waiting", "Requests queued for admission (including preempted ones)."),
}
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _EngineCollector:
    """Turns one stats dict into metric families at every scrape; keys the engine lacks are skipped."""

    def __init__(self, stats: Callable[[], dict], age: Callable[[], float] | None = None):
        self._stats = stats
        self._age = age

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if self._age is not None:
            yield GaugeMetricFamily("wisp_stats_age_seconds", "Age of the engine stats snapshot this scrape shows "
                                    "(refreshed per scrape; large only if the engine thread was busy past the timeout).",
                                    value=self._age())
        for key, (name, doc) in COUNTERS.items():
            if key in stats:
                yield CounterMetricFamily(name, doc, value=float(stats[key]))
        for key, (name, doc) in GAUGES.items():
            if key in stats:
                yield GaugeMetricFamily(name, doc, value=float(stats[key]))
        yield from _layer_hit_rates(stats.get("per_layer", {}))
        if stats.get("split_controller"):
            yield from _split_controller(stats["split_controller"])
        if stats.get("load_control"):
            yield from _load_control(stats["load_control"])


def _layer_hit_rates(per_layer: dict) -> Iterator[Metric]:
    rates = GaugeMetricFamily("wisp_expert_layer_hit_rate", "Expert hits / (hits + misses) per MoE layer since start.",
                              labels=["layer"])
    for layer, c in per_layer.items():
        routed = c.get("hits", 0) + c.get("misses", 0)
        rates.add_metric([layer], c.get("hits", 0) / routed if routed else 0.0)
    yield rates


def _load_control(state: dict) -> Iterator[Metric]:
    """What load control chose at the last step, and how often it changed the decode set."""
    yield GaugeMetricFamily("wisp_decode_width", "Requests the last step decoded (load control's choice).",
                            value=state["decode_width"])
    yield GaugeMetricFamily("wisp_decode_held_back", "Requests ready to decode that load control held back at the "
                            "last step (their experts would not fit the slots with the others').", value=state["held_back"])
    yield GaugeMetricFamily("wisp_decode_joint_working_set", "The decoding set's predicted joint expert working set, "
                            "mean experts per MoE layer.", value=state["joint_working_set"])
    yield CounterMetricFamily("wisp_decode_set_switches", "Times load control changed the decoding set.",
                              value=state["switches"])
    yield CounterMetricFamily("wisp_decode_overdue", "Times a request reached the wait bound and decoded at once.",
                              value=state["overdue"])


def _split_controller(state: dict) -> Iterator[Metric]:
    """What the online split controller decides from, live, and every recent resize (when, from -> to, why)."""
    value = GaugeMetricFamily("wisp_split_marginal_value_seconds_per_byte",
                              "Seconds per request one more byte would save, by side (the controller's inputs).",
                              labels=["side"])
    value.add_metric(["expert_slots"], state["expert_slot_value"])
    value.add_metric(["kv_blocks"], state["kv_block_value"])
    yield value
    yield CounterMetricFamily("wisp_split_resizes", "Resizes the online split controller applied.", value=state["resizes"])
    if state["recent_resizes"]:  # the last one (the log keeps them all): one series, whatever the history
        r = state["recent_resizes"][-1]
        keys = ("from_cap", "to_cap", "from_kv_blocks", "to_kv_blocks", "reason")
        info = GaugeMetricFamily("wisp_split_last_resize_stall_seconds", "Seconds the last resize held the engine; "
                                 "labels: from -> to and why.", labels=list(keys))
        info.add_metric([str(r[k]) for k in keys], r["stall_s"])
        yield info
        yield GaugeMetricFamily("wisp_split_last_resize_at_seconds", "When the last resize happened, in seconds since "
                                "the controller started.", value=r["at_s"])


class ServerMetrics:
    """Implements `wisp.engine.async_engine.RequestObserver`; `render()` is one scrape."""

    def __init__(self, stats: Callable[[], dict], stats_age: Callable[[], float] | None = None):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(stats, stats_age))
        self.ttft = Histogram(
            "wisp_time_to_first_token_seconds", "Time from admission to a request's first token.",
            buckets=TTFT_BUCKETS, registry=self.registry,
        )
        self.itl = Histogram(
            "wisp_inter_token_latency_seconds", "Time between consecutive tokens of one request.",
            buckets=ITL_BUCKETS, registry=self.registry,
        )
        self.finished = Counter(
            "wisp_requests_finished", "Requests that left the engine, by finish reason.", ["finish_reason"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter("wisp_prompt_tokens", "Prompt tokens of finished requests.", registry=self.registry)
        self.generation_tokens = Counter(
            "wisp_generation_tokens", "Tokens generated for finished requests.", registry=self.registry
        )

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def observe_inter_token(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def observe_finished(self, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> None:
        self.finished.labels(finish_reason=finish_reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)

    def render(self) -> tuple[bytes, str]:
        """(body, content type) of the Prometheus text exposition."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

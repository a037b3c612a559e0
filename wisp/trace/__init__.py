"""Routing traces: wisp's own format (`format`), readers of other projects' traces (`readers`), and
trace-driven cache-policy simulation (`policies`). Exact LRU curves live in `wisp.core.reuse`."""

from wisp.trace.format import RoutingTrace

__all__ = ["RoutingTrace"]

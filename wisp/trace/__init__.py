"""Routing traces: wisp's own format (`format`), readers of other projects' traces (`readers`), the
recorder and the replay. Miss curves and cache-policy simulation over traces live in `wisp.plan`."""

from wisp.trace.format import RoutingTrace

__all__ = ["RoutingTrace"]

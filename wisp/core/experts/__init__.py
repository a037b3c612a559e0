"""Experts: where a MoE layer's experts live, how a routed step reaches them, and what it moved (pager, stores, counters)."""

"""wisp's vLLM method registered for a stretch of a test process, and vLLM's own restored after it."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def wisp_registered():
    """Register the plug-in as its entry point would (the tests run vLLM with VLLM_PLUGINS=""); on exit, vLLM's
    out-of-tree op registry is as it was, so modules that need vLLM untouched may run after."""
    from vllm.model_executor.custom_op import op_registry_oot

    from wisp.integrations.vllm import register

    before = dict(op_registry_oot)
    register()
    try:
        yield
    finally:
        op_registry_oot.clear()
        op_registry_oot.update(before)

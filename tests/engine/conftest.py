"""The engine tests' shared model: the demo, paged with 4 of its 16 experts in slots, built once per module."""

from __future__ import annotations

import pytest

from wisp import LLM


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WISP_CACHE", str(tmp_path_factory.getbasetemp() / "wisp-cache"))
        return LLM("demo", device="cpu", mode="paged", expert_cap=4)

"""`wisp serve` flag handling: bad flags, a taken port and engine refusals are one stderr line and exit 2.

Run in-process through `wisp.cli.main`; every case fails before uvicorn starts.
"""

from __future__ import annotations

import socket

import pytest

from wisp.cli import main


def fails(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("wisp: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "flags, needle",
    [
        ([], "--model"),
        (["--port", "70000"], "port"),
        (["--port", "http"], "port"),
        (["--kv-bytes", "2XB"], "size"),
        (["--kv-bytes", "0"], "size"),
        (["--kv-blocks", "0"], "positive"),
        (["--kv-blocks", "8", "--kv-bytes", "1GiB"], "not allowed with"),
        (["--max-concurrency", "0"], "positive"),
        (["--max-model-len", "-5"], "positive"),
        (["--mode", "swap"], "invalid choice"),
        (["--expert-cap", "many"], "invalid int"),
        (["--bogus"], "unrecognized"),
    ],
)
def test_bad_flags(capsys, flags, needle):
    model = [] if not flags else ["--model", "demo"]
    assert needle in fails(capsys, ["serve", *model, *flags])


def test_taken_port(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert f"127.0.0.1:{port}" in fails(capsys, ["serve", "--model", "demo", "--port", str(port)])


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--device", "tpu"], "unknown device"),
        (["--kv-blocks", "4"], "KV pool too small"),
        (["--max-model-len", "999999"], "max_position_embeddings"),
        (["--expert-cap", "99"], "expert cap"),
        (["--model", "/nonexistent/model"], "nonexistent"),
    ],
)
def test_engine_refusals(capsys, flags, needle):
    model = [] if "--model" in flags else ["--model", "demo"]
    assert needle in fails(capsys, ["serve", *model, "--port", "0", "--device", "cpu", *flags])


def test_split_controller_needs_a_budget_it_can_split(capsys, tmp_path):
    assert "--plan or --vram-budget" in fails(capsys, ["serve", "--model", "demo", "--port", "0", "--device", "cpu",
                                                       "--split-controller"])
    bare = tmp_path / "plan.json"  # caps and blocks only: no budget or costs to re-solve with
    bare.write_text('{"per_layer_caps": [8, 8, 8, 8], "kv_blocks": 64, "kv_block_size": 16}')
    assert "written by `wisp plan`" in fails(capsys, ["serve", "--model", "demo", "--port", "0", "--device", "cpu",
                                                     "--max-model-len", "256", "--plan", str(bare), "--split-controller"])


def _hot_budget(extra: int) -> str:
    """A --vram-budget for the demo model (4 x 256 tokens of KV) with `extra` slots' bytes past the KV floor."""
    from wisp.models.config_parsers import model_config
    from wisp.models.demo import DEMO_CONFIG
    from wisp.plan.planner import PlanInputs
    from wisp.plan.sizes import ModelSizes

    sizes = ModelSizes.of(model_config(DEMO_CONFIG), 16)
    inputs = PlanInputs(0, 4, 256)
    return str(sizes.non_expert_bytes + inputs.reserve_bytes + inputs.admission_floor_blocks * sizes.block_bytes
               + extra * sizes.slot_bytes)


def test_a_budget_sizes_hybrid_without_slots_hot_experts(capsys, monkeypatch):
    """`--mode hybrid --expert-cap 0 --vram-budget X`: the KV floor, then as many hot experts a layer as fit."""
    import wisp.server.serve

    served = []
    monkeypatch.setattr(wisp.server.serve, "serve", lambda app, engine, *a, **k: served.append(engine.engine))
    main(["serve", "--model", "demo", "--port", "0", "--device", "cpu", "--max-model-len", "256", "--mode", "hybrid",
          "--expert-cap", "0", "--vram-budget", _hot_budget(3)])
    assert "budget applied: 3 hot experts a layer" in capsys.readouterr().out
    (engine,) = served
    assert all(store.hot.capacity == 3 for store in engine.model.experts.values())


@pytest.mark.parametrize("flags, needle", [(["--hot-experts", "2"], "give one"),
                                           (["--split-controller"], "has no slots")])
def test_a_budget_for_hybrid_without_slots_refuses_what_it_cannot_do(capsys, flags, needle):
    assert needle in fails(capsys, ["serve", "--model", "demo", "--port", "0", "--device", "cpu", "--max-model-len",
                                    "256", "--mode", "hybrid", "--expert-cap", "0", "--vram-budget", _hot_budget(2),
                                    *flags])

"""Bad input: one clear line on stderr starting `wisp: error:`, exit status 2, never a traceback.

Every case runs through the CLI as a subprocess (`python -m wisp generate ...`) and, where the
Python API can be given the same input, through `LLM`, which must raise `WispError`.
Broken checkpoints are copies of the qwen3_moe `hf_checkpoints` fixture (8 experts, top-2, vocab 128,
max_position_embeddings 256, sharded with model.safetensors.index.json, no tokenizer.json).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli_runner import run_many
from wisp import LLM, SamplingParams, WispError

SUPPORTED = ("Qwen3MoeForCausalLM", "OlmoeForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM")
TOO_LONG = ",".join(["1"] * 300)  # > max_position_embeddings (256) of the fixture models


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """The contract: exit 2, nothing on stdout, exactly one `wisp: error:` line on stderr."""
    shown = f"rc={proc.returncode}\nstdout={proc.stdout!r}\nstderr={proc.stderr!r}"
    assert "Traceback" not in proc.stderr, shown
    assert proc.returncode == 2, shown
    assert proc.stdout == "", shown
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, shown
    line = lines[0]
    assert line.startswith("wisp: error: "), shown
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


# -- broken checkpoints ---------------------------------------------------------------------------


def _shards(path: Path) -> list[str]:
    index = json.loads((path / "model.safetensors.index.json").read_text())
    return sorted(set(index["weight_map"].values()))


@pytest.fixture(scope="module")
def good(hf_checkpoints) -> Path:
    path = hf_checkpoints["qwen3_moe"]
    assert len(_shards(path)) >= 2 and not (path / "tokenizer.json").exists()
    return path


@pytest.fixture(scope="module")
def bad(tmp_path_factory, good) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """case -> (model path, fragments its error line must contain)."""
    root = tmp_path_factory.mktemp("bad-models")
    out: dict[str, tuple[Path, tuple[str, ...]]] = {}

    missing = root / "no-such-model"
    out["missing_dir"] = (missing, ("does not exist", str(missing)))

    a_file = root / "model.safetensors"
    a_file.write_bytes(b"not a directory")
    out["path_is_file"] = (a_file, ("neither a checkpoint directory nor a .gguf file", str(a_file)))

    not_gguf = root / "model.gguf"
    not_gguf.write_bytes(b"GGUF but not really")
    out["unreadable_gguf"] = (not_gguf, ("is not a readable GGUF file", str(not_gguf)))

    no_weights = root / "config-only"
    no_weights.mkdir()
    shutil.copy(good / "config.json", no_weights / "config.json")
    out["no_safetensors"] = (no_weights, ("no *.safetensors files", str(no_weights)))

    missing_shard = Path(shutil.copytree(good, root / "missing-shard"))
    gone = _shards(missing_shard)[-1]
    (missing_shard / gone).unlink()
    out["missing_shard"] = (missing_shard, (gone, "missing", "index"))

    for name, keep in (("truncated", 0.5), ("truncated_header", 4)):
        path = Path(shutil.copytree(good, root / name))
        shard = path / _shards(path)[1]
        size = shard.stat().st_size
        with open(shard, "r+b") as f:
            f.truncate(int(size * keep) if isinstance(keep, float) else keep)
        out[name] = (path, (shard.name, "truncated or unreadable"))

    arch = Path(shutil.copytree(good, root / "llama"))
    cfg = json.loads((arch / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (arch / "config.json").write_text(json.dumps(cfg))
    out["unsupported_arch"] = (arch, ("unsupported architecture", "LlamaForCausalLM", *SUPPORTED))
    return out


CHECKPOINT_CASES = ["missing_dir", "path_is_file", "unreadable_gguf", "no_safetensors", "missing_shard", "truncated",
                    "unsupported_arch"]


@pytest.mark.parametrize("case", [*CHECKPOINT_CASES, "truncated_header"])
def test_api_bad_checkpoint(bad, case):
    path, fragments = bad[case]
    with pytest.raises(WispError) as info:
        LLM(str(path), device="cpu")
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


# -- flags and prompts ----------------------------------------------------------------------------

CAP_RANGE = ("out of range", "top_k=2", "num_experts=8")

# case -> (arguments after --model GOOD, fragments of the error line)
FLAG_CASES: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "cap_below_top_k": (["--prompt-ids", "1,2", "--expert-cap", "1"], ("expert cap 1", *CAP_RANGE)),
    "cap_above_num_experts": (["--prompt-ids", "1,2", "--expert-cap", "9"], ("expert cap 9", *CAP_RANGE)),
    "prompt_too_long": (["--prompt-ids", TOO_LONG], ("300 tokens", "256", "max_position_embeddings")),
    "prompt_ids_not_int": (["--prompt-ids", "1,x,3"], ("--prompt-ids", "integers", "1,x,3")),
    "prompt_ids_empty": (["--prompt-ids", ""], ("--prompt-ids", "empty")),
    "text_without_tokenizer": (["--prompt", "Hello"], ("tokenizer.json", "--prompt-ids")),
    "token_outside_vocab": (["--prompt-ids", "1,128"], ("token id 128", "vocabulary", "128)")),
    "unknown_mode": (["--prompt-ids", "1,2", "--mode", "bogus"], ("--mode", "bogus", "paged", "resident", "offload")),
    "unknown_dtype": (["--prompt-ids", "1,2", "--dtype", "int8"], ("--dtype", "int8", "float32", "bfloat16")),
    "hot_experts_without_hybrid": (["--prompt-ids", "1,2", "--hot-experts", "2"],
                                   ("--hot-experts", "--mode hybrid-zero-copy", "--mode paged")),
}


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory, good, bad) -> dict[str, subprocess.CompletedProcess]:
    """Every CLI case, each its own `wisp generate` process, a few at a time."""
    cases = {name: ["--model", bad[name][0], "--prompt-ids", "1,2,3"] for name in CHECKPOINT_CASES}
    cases.update({name: ["--model", good, *args] for name, (args, _) in FLAG_CASES.items()})
    cases = {name: [*args, "--max-tokens", "2"] for name, args in cases.items()}
    return run_many(cases, tmp_path_factory.getbasetemp() / "wisp-cache")


@pytest.mark.slow
@pytest.mark.parametrize("case", CHECKPOINT_CASES)
def test_cli_bad_checkpoint(cli_results, bad, case):
    assert_one_line_error(cli_results[case], *bad[case][1])


@pytest.mark.slow
@pytest.mark.parametrize("case", list(FLAG_CASES))
def test_cli_bad_flags_and_prompts(cli_results, case):
    assert_one_line_error(cli_results[case], *FLAG_CASES[case][1])


def test_cli_fail_is_one_line_for_multiline_messages(monkeypatch, capsys):
    """Errors from the hub client or safetensors can span lines; `fail` must still print one."""
    import wisp
    from wisp import cli

    def broken_llm(*args, **kwargs):
        raise WispError("could not fetch x/y from the hub: 404\n\nRepository Not Found\n  Please check.")

    monkeypatch.setattr(wisp, "LLM", broken_llm)
    with pytest.raises(SystemExit) as info:
        cli.main(["generate", "--model", "x/y", "--prompt-ids", "1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == "wisp: error: could not fetch x/y from the hub: 404 Repository Not Found Please check.\n"


@pytest.mark.parametrize(
    "kwargs, match",
    [({"max_tokens": 0}, "max_tokens must be >= 1"), ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
     ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"), ({"top_k": -1}, "top_k must be >= 0"),
     ({"temperature": 1e-50}, "temperature 1e-50 rounds to 0.0 in float32"),
     ({"temperature": 1e39}, "temperature 1e\\+39 rounds to inf in float32"),
     ({"top_p": 1e-50}, "top_p 1e-50 rounds to 0 in float32")],
)
def test_api_bad_sampling_params(kwargs, match):
    with pytest.raises(WispError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("cap", [1, 9])
def test_api_expert_cap_out_of_range(good, cap):
    with pytest.raises(WispError, match=r"expert cap \d+ is out of range: it must be between top_k=2 and num_experts=8"):
        LLM(str(good), device="cpu", expert_cap=cap)


@pytest.mark.parametrize("kwargs, match", [({"mode": "bogus"}, "unknown mode 'bogus'"),
                                           ({"dtype": "int8"}, "unsupported dtype 'int8'"),
                                           ({"device": "tpu"}, "unknown device 'tpu'"),
                                           ({"mode": "hybrid", "expert_cap": 0, "hot_experts": 99},
                                            "hot-experts 99 exceeds the model's 8 experts"),
                                           ({"mode": "hybrid", "expert_cap": 0, "hot_experts": -1}, "hot-experts must be >= 0")])
def test_api_bad_engine_options(good, kwargs, match):
    with pytest.raises(WispError, match=match):
        LLM(str(good), **{"device": "cpu", **kwargs})


@pytest.fixture(scope="module")
def llm(good) -> LLM:
    return LLM(str(good), device="cpu")


@pytest.mark.parametrize(
    "prompt, match",
    [
        ([1] * 300, r"prompt has 300 tokens; the model's limit is 256"),
        ([1] * 256, r"prompt has 256 tokens; the model's limit is 256"),  # no room for a generated token
        ("Hello", r"no tokenizer\.json: pass token ids \(--prompt-ids\)"),
        ([1, 128], r"token id 128 is outside the vocabulary \[0, 128\)"),
        ([1, -1], r"token id -1 is outside the vocabulary"),
        ([], r"prompt is empty"),
    ],
    ids=["too_long", "at_limit", "text_without_tokenizer", "token_128", "token_negative", "empty"],
)
def test_api_bad_prompt(llm, prompt, match):
    with pytest.raises(WispError, match=match):
        llm.generate([prompt], SamplingParams(max_tokens=2))


def test_api_bad_prompt_is_checked_before_any_work(llm):
    """A batch with one bad prompt fails as a whole, before prefill touches any expert."""
    llm.reset_stats()
    with pytest.raises(WispError):
        llm.generate([[1, 2, 3], [1, 500]], SamplingParams(max_tokens=2))
    assert llm.stats()["expert_hits"] + llm.stats()["expert_misses"] == 0


# -- malformed metadata and non-integer ids are WispErrors too


@pytest.mark.parametrize("prompt", [[1, "x", 3], [1, None], [1, 1.5]], ids=["str", "none", "float"])
def test_api_non_integer_token_ids(llm, prompt):
    with pytest.raises(WispError):
        llm.generate([prompt], SamplingParams(max_tokens=2))


def _edited_copy(good: Path, dst: Path, edit) -> Path:
    path = Path(shutil.copytree(good, dst))
    edit(path)
    return path


def _drop_hidden_size(path: Path) -> None:
    cfg = json.loads((path / "config.json").read_text())
    del cfg["hidden_size"]
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "edit",
    [
        _drop_hidden_size,
        lambda p: (p / "generation_config.json").write_text("{not json"),
        lambda p: (p / "tokenizer.json").write_text("{not json"),
    ],
    ids=["config_missing_field", "generation_config_not_json", "tokenizer_json_corrupt"],
)
def test_api_malformed_metadata(good, tmp_path, edit):
    path = _edited_copy(good, tmp_path / "m", edit)
    with pytest.raises(WispError):
        LLM(str(path), device="cpu")


# -- found in review: inputs that once crashed a batch or escaped as a traceback


@pytest.mark.parametrize("kwargs", [dict(temperature=float("nan")), dict(temperature=float("inf")), dict(seed=2**64),
                                    dict(seed=-1)])
def test_non_finite_temperature_and_out_of_range_seed_are_rejected(kwargs):
    with pytest.raises(WispError):
        SamplingParams(**kwargs)


def test_tiny_temperature_samples_the_argmax_instead_of_overflowing():
    import torch

    from wisp.engine.sampling import Sampler

    assert Sampler(SamplingParams(temperature=1e-40, seed=0))(torch.tensor([0.5, 3.0, 2.9])).token == 1


def test_a_failed_generate_leaves_nothing_in_the_engine(llm, monkeypatch):
    engine = llm.engine

    def boom(*args, **kwargs):
        raise RuntimeError("forward failed")

    monkeypatch.setattr(engine.runner.model, "forward", boom)  # the whole step fails: generate raises
    with pytest.raises(RuntimeError):
        llm.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=3))
    monkeypatch.undo()
    assert not engine.requests and not engine.has_unfinished() and engine.pool.num_used == 0
    assert len(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3))[0].token_ids) == 3


def test_a_failing_sampler_fails_its_requests_alone(llm, monkeypatch):
    engine = llm.engine

    def boom(self, logits, *args):
        raise RuntimeError("sampler failed")

    monkeypatch.setattr("wisp.engine.sampling.Sampler.prepare", boom)  # one request's part of the step fails
    outs = llm.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=3))
    assert [(o.finish_reason, o.token_ids) for o in outs] == [("error", [])] * 2
    assert all("failed in its sampling" in o.error for o in outs)
    monkeypatch.undo()
    assert not engine.requests and not engine.has_unfinished() and engine.pool.num_used == 0

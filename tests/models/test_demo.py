"""The built-in demo (`wisp.models.demo`): the shipped trained checkpoint is what its trainer wrote, wisp reads it as
transformers does, it speaks English-like text, and its training is deterministic; `demo-random` stays available."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.cli_runner import run_wisp
from tests.helpers import demo_routing
from wisp import LLM, SamplingParams
from wisp.models.demo import DEMO_CONFIG, TRAINED_DEMO, TRAINED_DEMO_SAMPLING, byte_tokenizer, demo_path
from wisp.models.demo_text import SCORE_WINDOW, demo_text, digest
from wisp.trace.recorder import RoutingRecorder

README_COMMAND = ["--model", "demo", "--prompt", "The for statement", "--max-tokens", "64", "--json"]
ON_CPU = ["--device", "cpu"]  # the seeds' samples as on CI's machines, whatever this one has
COMMON_WORDS = {"the", "of", "a", "is", "to", "and", "in", "an", "for", "as", "be", "or", "are", "that", "with", "it"}


def training_record() -> dict:
    return json.loads((TRAINED_DEMO / "training.json").read_text())


def same_text_as_training() -> None:
    """Skip where this Python's pydoc topics differ from those the demo was trained, scored and recorded on (the
    held-out text would differ too)."""
    if digest() != training_record()["text_sha256"]:
        pytest.skip("this Python's pydoc_data.topics differ from the text the demo was trained on")


def english_like(text: str) -> bool:
    """Mostly letters, spaces and punctuation, with common English words among its words."""
    printable = sum(ch.isascii() and (ch.isprintable() or ch in "\n\t") for ch in text) / max(1, len(text))
    words = re.findall(r"[a-z]+", text.lower())
    return printable > 0.95 and len(words) >= 5 and sum(w in COMMON_WORDS for w in words) >= 2


def test_shipped_config_and_tokenizer_are_the_demo_s():
    assert json.loads((TRAINED_DEMO / "config.json").read_text()) == DEMO_CONFIG
    shipped = json.loads((TRAINED_DEMO / "tokenizer.json").read_text())
    assert shipped == json.loads(byte_tokenizer().to_str())
    assert demo_path("demo") == TRAINED_DEMO
    record = training_record()
    import hashlib

    assert hashlib.sha256((TRAINED_DEMO / "model.safetensors").read_bytes()).hexdigest() == record["weights_sha256"]


def test_random_demo_is_another_model_of_the_same_shape(tmp_path, monkeypatch):
    monkeypatch.setenv("WISP_CACHE", str(tmp_path))
    prompt = byte_tokenizer().encode("The list type").ids
    trained = LLM("demo", device="cpu", mode="resident").prompt_logits(prompt)
    random = LLM("demo-random", device="cpu", mode="resident")
    trained_cfg = LLM("demo", device="cpu", mode="resident").config
    assert random.config == dataclasses.replace(trained_cfg, sampling_defaults=())  # greedy by default
    assert dict(trained_cfg.sampling_defaults) == TRAINED_DEMO_SAMPLING
    assert not torch.equal(trained, random.prompt_logits(prompt))


def test_greedy_tokens_equal_transformers_on_the_shipped_checkpoint():
    transformers = pytest.importorskip("transformers")
    AutoModelForCausalLM = transformers.AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(TRAINED_DEMO), dtype=torch.float32).eval()
    prompt = byte_tokenizer().encode("A for statement").ids
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)[0, len(prompt):].tolist()
    for mode, cap in (("resident", None), ("paged", 4)):
        out = LLM("demo", device="cpu", mode=mode, expert_cap=cap).generate([prompt], SamplingParams(max_tokens=32))[0]
        assert out.token_ids == ref, mode
    assert len(set(ref)) > 4


@pytest.mark.slow
def test_wisp_scores_the_held_out_text_as_the_trainer_did(tmp_path):
    """`wisp bench perplexity` (wisp's engine) within 2% of the bits/byte the training script measured with
    transformers on the float16-rounded weights it shipped."""
    same_text_as_training()
    out = tmp_path / "ppl.json"
    proc = run_wisp(["perplexity", "--model", "demo", "--device", "cpu", "--out", out], tmp_path, command="bench")
    assert proc.returncode == 0, proc.stderr
    ours, trainer = json.loads(out.read_text())["bits_per_byte"], training_record()["held_out_bits_per_byte"]
    assert abs(ours - trainer) <= 0.02 * trainer, (ours, trainer)  # the acceptance bar
    assert abs(ours - trainer) <= 1e-3 * trainer, (ours, trainer)  # what it is: the same forward, other kernels


def test_the_shipped_routing_is_the_demo_s_own():
    """The shipped trace's first window equals a fresh recording of the demo over the same held-out bytes."""
    same_text_as_training()
    trace = demo_routing()
    ids = byte_tokenizer().encode(demo_text("held-out")).ids[:SCORE_WINDOW]
    llm = LLM("demo", device="cpu", mode="resident")
    recorder = RoutingRecorder(llm.config.moe_layer_ids, llm.config.num_experts).attach(llm.engine)
    llm.prompt_logits(ids)
    fresh = recorder.trace().ids
    assert trace.num_tokens == len(demo_text("held-out").encode()) and trace.step is None
    assert set(trace.sequence_lengths[:-1]) == {SCORE_WINDOW}  # one sequence a scored window
    same = np.mean(np.sort(fresh, axis=-1) == np.sort(trace.ids[:SCORE_WINDOW], axis=-1))
    assert same > 0.99, same  # all of them here; another CPU's rounding may flip a near tie


@pytest.mark.slow
def test_the_readme_s_demo_command_speaks(tmp_path):
    """The README's `wisp generate --model demo --prompt "The for statement" --max-tokens 64 --json` samples (the
    demo's generation_config) English-like text; a seed makes it reproducible, and --temperature 0 still means
    greedy."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert 'wisp generate --model demo --prompt "The for statement" --max-tokens 64 --json' in readme
    texts = []
    for seed in (0, 1, 2):
        proc = run_wisp([*README_COMMAND, *ON_CPU, "--seed", seed],
                        tmp_path)
        assert proc.returncode == 0, proc.stderr
        texts.append(json.loads(proc.stdout)["text"])
    assert all(english_like(t) for t in texts), texts
    assert len(set(texts)) == 3
    again = run_wisp([*README_COMMAND, *ON_CPU, "--seed", 0], tmp_path)
    assert json.loads(again.stdout)["text"] == texts[0]
    greedy = run_wisp([*README_COMMAND, *ON_CPU, "--max-tokens", 24, "--temperature", 0], tmp_path)
    prompt = byte_tokenizer().encode("The for statement").ids
    api = LLM("demo", device="cpu").generate([prompt], SamplingParams(max_tokens=24))[0]  # temperature 0: greedy
    assert json.loads(greedy.stdout)["token_ids"] == api.token_ids


@pytest.mark.slow
def test_training_is_deterministic(tmp_path):
    """Two short runs from one seed write the same weight bytes and score the held-out text the same, and training
    moved the weights away from the seed's initialisation."""
    pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from wisp.models.demo_training import hf_model, hub_tensors, main

    threads = torch.get_num_threads()
    try:
        for name in ("a", "b"):
            main(["--out", str(tmp_path / name), "--steps", "3", "--batch", "2", "--context", "32", "--eval-every", "3"])
        initial = hub_tensors(hf_model(seed=0))
    finally:
        torch.set_num_threads(threads)  # the trainer sets its own count; the worker's other tests keep theirs
    a, b = (tmp_path / "a" / "model.safetensors").read_bytes(), (tmp_path / "b" / "model.safetensors").read_bytes()
    assert a == b
    records = [json.loads((tmp_path / n / "training.json").read_text()) for n in ("a", "b")]
    assert records[0]["weights_sha256"] == records[1]["weights_sha256"]
    assert records[0]["held_out_bits_per_byte"] == records[1]["held_out_bits_per_byte"]
    trained = load_file(str(tmp_path / "a" / "model.safetensors"))
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[k], initial[k]) for k in trained)

"""Failure isolation: one request whose sampling or stop check raises, in a running batch of 4, is finished
alone with "error"; the other 3 finish exactly as they do without it, and no KV block leaks."""

from __future__ import annotations

import pytest
import torch

import wisp.engine.scheduler as scheduler_module
from wisp.config import EngineConfig
from wisp.engine.engine import LLMEngine
from wisp.engine.request_failure import SAMPLING, STOP_CHECK
from wisp.engine.sampling import SamplingParams

PROMPTS = [[(7 * i + 13 * j) % 250 for i in range(9 + 5 * j)] for j in range(4)]
POISONED = "r2"
FAIL_AT = 3  # the poisoned request's 3rd sampled token fails: it is mid-decode beside the others
PARAMS = [SamplingParams(max_tokens=10, ignore_eos=True),  # greedy and seeded sampling both
          SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.8, top_p=0.9, seed=1),
          SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.8, seed=2),
          SamplingParams(max_tokens=10, ignore_eos=True, top_k=5, temperature=1.0, seed=3)]


@pytest.fixture
def make_engine(device, attention_backend):
    def make() -> LLMEngine:
        return LLMEngine(EngineConfig(model="demo", device=device, mode="paged", expert_cap=6, max_model_len=128,
                                      max_concurrency=4, attention_backend=attention_backend))

    return make


class Poisoned:
    """A sampler double: the real one, except that its `FAIL_AT`-th call of `stage` (prepare, noise or finish)
    raises."""

    def __init__(self, real, stage: str):
        self.real, self.stage, self.calls = real, stage, 0
        self.params = real.params

    def __getattr__(self, name):
        method = getattr(self.real, name)
        if name != self.stage:
            return method

        def poisoned(*args):
            self.calls += 1
            if self.calls == FAIL_AT:
                raise RuntimeError("injected sampler failure")
            return method(*args)
        return poisoned


def run(engine: LLMEngine, rids: list[str]) -> tuple[dict, list[list]]:
    """Add the requests with these ids (rN: PROMPTS[N]), run them out; their sequences and every step's outputs."""
    for rid in rids:
        j = int(rid[1:])
        engine.add_request(rid, PROMPTS[j], PARAMS[j], keep_logits=True)
    seqs = {rid: engine.requests[rid] for rid in rids}
    steps = []
    while engine.has_unfinished():
        steps.append(engine.step())
        engine.pool.check_integrity([s.block_table for s in engine.scheduler.running])
    return seqs, steps


def assert_healthy_match(seqs: dict, ref: dict) -> None:
    for rid, want in ref.items():
        got = seqs[rid]
        assert got.finish_reason == "length" and got.failure is None, rid
        assert got.output_ids == want.output_ids, rid
        assert len(got.logits) == len(want.logits) == 10
        assert all(torch.equal(a, b) for a, b in zip(got.logits, want.logits)), rid


def assert_no_leak(engine: LLMEngine) -> None:
    assert not engine.requests and not engine.scheduler.running and not engine.scheduler.waiting
    assert engine.pool.num_used == 0
    engine.pool.check_integrity([])


@pytest.mark.parametrize("stage", ["prepare", "noise", "finish"])
def test_a_failing_sampler_ends_its_request_alone(make_engine, stage):
    healthy = ["r0", "r1", "r3"]
    ref, _ = run(make_engine(), healthy)

    engine = make_engine()
    for j in range(4):
        engine.add_request(f"r{j}", PROMPTS[j], PARAMS[j], keep_logits=True)
    seqs = {rid: engine.requests[rid] for rid in ("r0", "r1", "r2", "r3")}
    seqs[POISONED].sampler = Poisoned(seqs[POISONED].sampler, stage)
    failed_step = None
    while engine.has_unfinished():
        outs = engine.step()
        engine.pool.check_integrity([s.block_table for s in engine.scheduler.running])
        if any(o.request_id == POISONED for o in outs if o.finished):
            failed_step = outs

    bad = seqs[POISONED]
    assert bad.finish_reason == "error" and bad.failure.stage == SAMPLING
    assert "injected sampler failure" in bad.failure.cause
    assert len(bad.output_ids) == FAIL_AT - 1 and len(bad.logits) == FAIL_AT - 1  # nothing from the failed step
    (out,) = [o for o in failed_step if o.request_id == POISONED]
    assert out.finished and out.new_token_ids == [] and out.error and "injected" not in out.error
    assert {o.request_id for o in failed_step} == {"r0", "r1", "r2", "r3"}  # the step went on for the others
    assert all(not o.finished for o in failed_step if o.request_id != POISONED)
    assert_healthy_match(seqs, ref)
    assert_no_leak(engine)


def test_a_failing_stop_check_ends_its_request_alone(make_engine, monkeypatch):
    ref, _ = run(make_engine(), ["r0", "r1", "r3"])
    real = scheduler_module.stop_reason

    def poisoned_stop_reason(seq, token, eos_token_ids):
        if seq.request_id == POISONED and len(seq.output_ids) == FAIL_AT:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected detokenizer failure")
        return real(seq, token, eos_token_ids)

    monkeypatch.setattr(scheduler_module, "stop_reason", poisoned_stop_reason)
    engine = make_engine()
    seqs, steps = run(engine, ["r0", "r1", "r2", "r3"])
    bad = seqs[POISONED]
    assert bad.finish_reason == "error" and bad.failure.stage == STOP_CHECK
    assert len(bad.output_ids) == FAIL_AT - 1  # the token whose check failed was taken back
    last = [o for outs in steps for o in outs if o.request_id == POISONED][-1]
    assert last.finished and last.finish_reason == "error" and last.new_token_ids == [] and last.error
    assert_healthy_match(seqs, ref)
    assert_no_leak(engine)


def test_a_failing_forward_still_fails_the_step(make_engine, monkeypatch):
    engine = make_engine()
    engine.add_request("r0", PROMPTS[0], PARAMS[0])

    def broken(*args, **kwargs):
        raise RuntimeError("injected forward failure")

    monkeypatch.setattr(engine.runner.model, "forward", broken)
    with pytest.raises(RuntimeError, match="injected forward failure"):
        engine.step()


def test_a_batch_draw_that_raises_is_drawn_row_by_row_with_the_same_tokens(make_engine, monkeypatch):
    """Should the batch's draw itself raise (no request to blame), each row is drawn alone from the draws it already
    took: every request finishes with the tokens it gets when the batch draw works."""
    import wisp.engine.sequence_sampling as sequence_sampling

    rids = ["r0", "r1", "r2", "r3"]
    ref, _ = run(make_engine(), rids)
    real = sequence_sampling.sample_batch

    def fails_on_batches(rows, params, noise):
        if rows.shape[0] > 1:
            raise RuntimeError("injected batch failure")
        return real(rows, params, noise)

    monkeypatch.setattr(sequence_sampling, "sample_batch", fails_on_batches)
    engine = make_engine()
    seqs, _ = run(engine, rids)
    assert_healthy_match(seqs, ref)
    assert_no_leak(engine)

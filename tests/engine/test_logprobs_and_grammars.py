"""The engine's per-request logits work on the demo model: logprobs are log_softmax of the logits it sampled from,
asking for them (or adjusting other requests' logits) never changes a request's tokens, and a grammar holds a
request's output while the requests beside it decode as before."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from hypothesis import given, settings, strategies as st

from wisp import SamplingParams
from wisp.engine.grammar import json_schema_grammar, regex_grammar

PROMPTS = ["Hello", "The quick brown fox", "1 2 3 4"]


def test_greedy_logprobs_equal_log_softmax_of_the_sampled_logits(demo):
    outs = demo.generate(PROMPTS, SamplingParams(max_tokens=10, ignore_eos=True, logprobs=5), return_logits=True)
    for out in outs:
        assert len(out.logprobs) == len(out.token_ids) == len(out.logits)
        for token, entry, logits in zip(out.token_ids, out.logprobs, out.logits):
            expected = torch.log_softmax(logits.float(), -1)
            assert entry.token == token == int(expected.argmax())
            assert abs(entry.logprob - float(expected[token])) <= 1e-5
            top = torch.topk(expected, 5)
            assert [t for t, _ in entry.top] == top.indices.tolist()
            assert all(abs(lp - v) <= 1e-5 for (_, lp), v in zip(entry.top, top.values.tolist()))


@given(st.integers(0, 20), st.sampled_from([0.0, 0.8]), st.integers(0, 2**31))
@settings(max_examples=6, deadline=None)
def test_asking_for_logprobs_never_changes_the_tokens(demo, top, temperature, seed):
    base = SamplingParams(max_tokens=8, ignore_eos=True, temperature=temperature, seed=seed)
    plain = demo.generate(PROMPTS, base)
    with_lp = demo.generate(PROMPTS, [SamplingParams(**{**base.__dict__, "logprobs": top}), base, base])
    assert [o.token_ids for o in plain] == [o.token_ids for o in with_lp]
    assert with_lp[0].logprobs is not None and with_lp[1].logprobs is None


def test_a_neighbours_bias_and_penalties_do_not_change_a_request(demo):
    base = SamplingParams(max_tokens=8, ignore_eos=True)
    alone = demo.generate(PROMPTS[:1], base)[0].token_ids
    busy = SamplingParams(max_tokens=8, ignore_eos=True, logit_bias=((65, 50.0),), presence_penalty=1.5,
                          frequency_penalty=-1.0)
    together = demo.generate(PROMPTS, [base, busy, busy])
    assert together[0].token_ids == alone
    assert set(together[1].token_ids) == {65}  # a +50 bias wins every greedy step


def run_constrained(demo, grammar: str, params: SamplingParams, prompt: str = "Answer:"):
    """Generate one constrained request beside two unconstrained ones; (its text, the others' token ids)."""
    engine = demo.engine
    constraint = engine.grammars.constraint(grammar)
    engine.add_request("constrained", demo.encode(prompt), params, constraint=constraint)
    engine.add_request("free-0", demo.encode(PROMPTS[0]), SamplingParams(max_tokens=8, ignore_eos=True))
    engine.add_request("free-1", demo.encode(PROMPTS[1]), SamplingParams(max_tokens=8, ignore_eos=True))
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    return finished["constrained"], [finished[f"free-{i}"].token_ids for i in range(2)]


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_json_schema_holds_and_its_neighbours_decode_as_alone(demo, temperature):
    alone = [o.token_ids for o in demo.generate(PROMPTS[:2], SamplingParams(max_tokens=8, ignore_eos=True))]
    out, neighbours = run_constrained(demo, json_schema_grammar(SCHEMA),
                                      SamplingParams(max_tokens=200, temperature=temperature, seed=3))
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text), SCHEMA)
    assert neighbours == alone


def test_a_regex_holds(demo):
    out, _ = run_constrained(demo, regex_grammar(r"(yes|no), [0-9]{3}"), SamplingParams(max_tokens=50))
    assert out.finish_reason == "stop" and out.text[:2] in ("ye", "no") and out.text[-3:].isdigit()


def test_prompt_logprobs_are_the_teacher_forced_distribution(demo):
    ids = demo.encode("Hello there")
    entries = demo.engine.prompt_logprobs(ids, 2)
    logits = demo.prompt_logits(ids)
    assert entries[0] is None and len(entries) == len(ids)
    for i in range(1, len(ids)):
        expected = torch.log_softmax(logits[i - 1].float(), -1)
        assert abs(entries[i].logprob - float(expected[ids[i]])) <= 1e-5


def test_masks_prepared_together_equal_each_grammar_own(demo):
    from wisp.engine.grammar import prepare_masks

    grammars = demo.engine.grammars
    made = [grammars.constraint(json_schema_grammar(SCHEMA)), grammars.constraint(regex_grammar(r"[ab]{2}c"))]
    for c, prefix in zip(made, ['{"name":"x', "a"]):
        for token in demo.encode(prefix):
            c.accept(token)
    own = [c.allowed(torch.device("cpu")) for c in made]
    prepare_masks(made)
    assert all(c._prepared is not None for c in made)
    assert all(torch.equal(c.allowed(torch.device("cpu")), mask) for c, mask in zip(made, own))
    assert not torch.equal(own[0], own[1])


def test_a_tokenizer_the_grammar_engine_cannot_read_fails_only_constrained_requests(tmp_path):
    from wisp.engine.grammar import Grammars
    from wisp.errors import InvalidParameter
    from wisp.server.logprobs import TokenTexts

    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": {"type": "Unknown"}}')
    grammars = Grammars(bad, 259, [256])
    for _ in range(2):  # the same answer every time, without trying again
        with pytest.raises(InvalidParameter, match="unavailable for this model") as info:
            grammars.constraint(regex_grammar("a"), "structured_outputs")
        assert info.value.param == "structured_outputs"
    texts = TokenTexts(grammars.token_bytes, lambda ids: "".join(chr(65 + i) for i in ids))
    assert texts(1) == ("B", b"B")  # logprobs fall back to the tokenizer's own decode

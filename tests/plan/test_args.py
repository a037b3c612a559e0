"""`wisp plan`'s arguments (`wisp.plan.args`): a flag renamed from a paper symbol keeps its old spelling as
a hidden alias, for `wisp plan` and for `wisp sim`, which shares the budget arguments."""

from __future__ import annotations

import contextlib
import io

import pytest

from wisp.cli import build_parser

PLAN = ["plan", "--model", "demo", "--vram-budget", "1GiB", "--trace", "t.npz"]
SIM = ["sim", "--trace", "t.npz"]


@pytest.mark.parametrize("command", [PLAN, SIM], ids=["plan", "sim"])
def test_t_byte_is_a_hidden_alias_of_seconds_per_byte(command):
    parser = build_parser()
    new = parser.parse_args([*command, "--seconds-per-byte", "2e-11"])
    old = parser.parse_args([*command, "--t-byte", "2e-11"])
    assert new == old and new.seconds_per_byte == 2e-11 and not hasattr(new, "t_byte")
    assert parser.parse_args(command).seconds_per_byte is None
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit):
        parser.parse_args([command[0], "--help"])
    assert "--seconds-per-byte" in help_text.getvalue() and "--t-byte" not in help_text.getvalue()

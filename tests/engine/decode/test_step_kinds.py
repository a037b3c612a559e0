"""`StepKindChooser`: both kinds measured first, then the faster, with the slower re-measured now and then."""

from __future__ import annotations

import pytest

from wisp.engine.decode.step_kinds import EAGER, GRAPH, StepKindChooser


def drive(chooser: StepKindChooser, steps: int, seconds: dict[str, float], batch: int = 1) -> list[str]:
    kinds = []
    for _ in range(steps):
        kind = chooser.pick(batch)
        chooser.record(batch, kind, seconds[kind])
        kinds.append(kind)
    return kinds


@pytest.mark.parametrize("faster", [GRAPH, EAGER])
def test_measures_both_then_runs_the_faster_and_re_measures_the_other(faster):
    chooser = StepKindChooser(sample=3, explore_every=20, warmup=0, graph_warmup=0, decisive=4.0)
    seconds = {GRAPH: 2.0, EAGER: 1.0} if faster == EAGER else {GRAPH: 1.0, EAGER: 2.0}
    kinds = drive(chooser, 40, seconds)
    assert kinds[:6] == [EAGER] * 3 + [GRAPH] * 3 and chooser.best(1) == faster
    slower = GRAPH if faster == EAGER else EAGER
    assert [i + 1 for i, k in enumerate(kinds) if k == slower][3:] == [20, 21, 22, 40]  # explore_every, sample long
    assert kinds.count(faster) == 40 - 7


def test_a_clear_cut_difference_decides_after_the_least_steps_and_ends_an_exploration_early():
    chooser = StepKindChooser(sample=8, explore_every=40, warmup=0, least=3, graph_warmup=0, decisive=4.0)
    kinds = drive(chooser, 80, {GRAPH: 2.0, EAGER: 1.0})
    assert kinds[:6] == [EAGER] * 3 + [GRAPH] * 3 and set(kinds[6:39]) == {EAGER}
    assert [i + 1 for i, k in enumerate(kinds) if k == GRAPH][3:] == [40, 41, 42, 80]  # 3 of sample's 8


def test_slow_first_cpu_steps_do_not_hold_the_graph_to_its_whole_sample():
    """The last `least` steps decide: a process's cold CPU-helped steps do not keep the slower graph running."""
    chooser = StepKindChooser(sample=8, explore_every=40, warmup=0, least=3, graph_warmup=0)
    times = iter([40.0, 27.0, 22.0] + [33.0] * 3 + [22.0] * 30)  # eager cold, then the graph, then eager warm
    kinds = []
    for _ in range(20):
        kind = chooser.pick(1)
        chooser.record(1, kind, next(times) if kind == EAGER or kinds.count(GRAPH) < 3 else 33.0)
        kinds.append(kind)
    assert kinds[:7] == [EAGER] * 3 + [GRAPH] * 3 + [EAGER] and kinds.count(GRAPH) == 3 and chooser.best(1) == EAGER


def test_times_that_keep_overlapping_are_measured_up_to_the_sample_and_compared_by_median():
    chooser = StepKindChooser(sample=4, explore_every=40, warmup=0, least=2, graph_warmup=0)
    noisy = iter([1.0, 3.0, 2.0, 2.5, 1.0, 3.0, 2.0, 2.5] + [1.0] * 40)  # eager 1, 3, ... | graph 2, 2.5, ...
    kinds = []
    for _ in range(12):
        kind = chooser.pick(1)
        chooser.record(1, kind, next(noisy))
        kinds.append(kind)
    assert kinds[:8] == [EAGER] * 2 + [GRAPH] * 2 + [EAGER] * 2 + [GRAPH] * 2
    assert chooser.best(1) == EAGER and set(kinds[8:]) == {EAGER}  # median 2.0 against 2.25


def test_batch_sizes_are_measured_apart_and_a_changed_speed_is_followed():
    chooser = StepKindChooser(sample=2, explore_every=10, warmup=0, graph_warmup=0)
    drive(chooser, 10, {GRAPH: 1.0, EAGER: 2.0}, batch=1)
    assert chooser.best(1) == GRAPH and chooser.best(2) is None
    drive(chooser, 1, {GRAPH: 1.0, EAGER: 0.5}, batch=2)
    assert chooser.medians() == {"1": {GRAPH: 1.0, EAGER: 2.0}, "2": {EAGER: 0.5}}  # what stats report
    assert chooser.windows() == {"1": {GRAPH: [1.0, 1.0], EAGER: [2.0, 2.0]}, "2": {EAGER: [0.5]}}
    drive(chooser, 20, {GRAPH: 3.0, EAGER: 2.0}, batch=1)  # graph steps got slower: its window refills
    assert chooser.best(1) == EAGER


@pytest.mark.parametrize("graph_warmup", [0, 1, 2])
def test_cold_steps_of_each_kind_are_run_but_not_timed(graph_warmup):
    chooser = StepKindChooser(sample=2, explore_every=20, warmup=2, graph_warmup=graph_warmup, decisive=4.0)
    kinds = []
    for i in range(6 + graph_warmup):
        kind = chooser.pick(1)
        kinds.append(kind)
        cold = kinds.count(kind) <= (2 if kind == EAGER else graph_warmup)
        chooser.record(1, kind, 100.0 if cold else {GRAPH: 2.0, EAGER: 1.0}[kind])
    assert kinds == [EAGER] * 4 + [GRAPH] * (2 + graph_warmup)
    assert chooser.medians() == {"1": {GRAPH: 2.0, EAGER: 1.0}} and chooser.best(1) == EAGER


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        StepKindChooser(sample=4, explore_every=8)
    with pytest.raises(ValueError):  # 2 x 4 + 3 + 3 = 14: the exploring windows would not fit
        StepKindChooser(sample=4, explore_every=14, warmup=3, graph_warmup=3)
    StepKindChooser(sample=4, explore_every=14, warmup=3, graph_warmup=2)
    with pytest.raises(ValueError):
        StepKindChooser(sample=4, explore_every=40, warmup=-1)
    with pytest.raises(ValueError):
        StepKindChooser(sample=4, explore_every=40, decisive=1.0)


def test_one_slow_step_of_the_winner_does_not_reopen_the_measuring():
    """Decided early (the loser's window still short), a hiccup of the winner keeps the winner running."""
    chooser = StepKindChooser(sample=8, explore_every=100, warmup=0, least=3, graph_warmup=0)
    kinds = drive(chooser, 16, {GRAPH: 33.0, EAGER: 22.0})  # the CPU-helped window full, the graph's at 3
    assert kinds == [EAGER] * 3 + [GRAPH] * 3 + [EAGER] * 10 and chooser.best(1) == EAGER
    kinds = drive(chooser, 1, {GRAPH: 33.0, EAGER: 34.0})  # one slow CPU-helped step: no clear cut now
    kinds += drive(chooser, 20, {GRAPH: 33.0, EAGER: 22.0})
    assert kinds == [EAGER] * 21 and chooser.best(1) == EAGER


@pytest.mark.parametrize("faster", [GRAPH, EAGER])
def test_a_wide_margin_decides_after_one_timed_step_of_each_kind_and_ends_graph_explorations_after_one(faster):
    """The H200's OLMoE with no slots: 34 ms graph steps against 17-20 ms CPU-helped ones (and the reverse)."""
    chooser = StepKindChooser(sample=8, explore_every=40, warmup=0, least=3, graph_warmup=0)  # decisive 1.5
    slower = GRAPH if faster == EAGER else EAGER
    seconds = {faster: 0.018, slower: 0.034}
    kinds = drive(chooser, 81, seconds)
    assert kinds[:4] == [EAGER] * 3 + [GRAPH] and chooser.best(1) == faster  # eager goes first, `least` steps
    measured_first = 3 if slower == EAGER else 1
    # then at each exploration (steps 40 and 80): the graph one step; CPU-helped steps their `least` (a first
    # one after a long rest can be cold)
    explorations = [40, 41, 42, 80, 81] if slower == EAGER else [40, 80]
    assert [i + 1 for i, k in enumerate(kinds) if k == slower][measured_first:] == explorations


def test_a_margin_below_decisive_keeps_the_least_steps_rule():
    chooser = StepKindChooser(sample=8, explore_every=40, warmup=0, least=3, graph_warmup=0)
    kinds = drive(chooser, 41, {GRAPH: 0.024, EAGER: 0.018})  # 1.33x: not decisive
    assert kinds[:7] == [EAGER] * 3 + [GRAPH] * 3 + [EAGER]
    assert [i + 1 for i, k in enumerate(kinds) if k == GRAPH][3:] == [40, 41]  # the exploration goes on


def test_an_exploration_whose_first_step_is_not_decisively_slower_goes_on():
    """The graph got faster since the decision: one step no longer ends its exploration, and it is re-measured."""
    chooser = StepKindChooser(sample=8, explore_every=40, warmup=0, least=3, graph_warmup=0)
    drive(chooser, 39, {GRAPH: 0.034, EAGER: 0.018})
    assert chooser.best(1) == EAGER
    kinds = drive(chooser, 10, {GRAPH: 0.012, EAGER: 0.018})
    assert kinds[:3] == [GRAPH] * 3 and chooser.best(1) == GRAPH


def test_one_slow_step_after_a_decisive_choice_does_not_reopen_the_measuring():
    chooser = StepKindChooser(sample=8, explore_every=100, warmup=0, least=3, graph_warmup=0)
    kinds = drive(chooser, 10, {GRAPH: 0.034, EAGER: 0.018})  # decided after one graph step
    kinds += drive(chooser, 1, {GRAPH: 0.034, EAGER: 0.030})  # a hiccup: 0.034 is no longer 1.5x the slowest
    kinds += drive(chooser, 20, {GRAPH: 0.034, EAGER: 0.018})
    assert kinds == [EAGER] * 3 + [GRAPH] + [EAGER] * 27 and chooser.best(1) == EAGER


def test_one_fast_old_step_keeps_a_window_from_being_decisive():
    """Decisive means every step of the slower kind, not its newest: a window holding one fast step decides
    by the `least` rule instead."""
    chooser = StepKindChooser(sample=8, explore_every=100, warmup=0, least=3, graph_warmup=0)
    times = iter([0.018] * 3 + [0.020, 0.034, 0.034])  # eager; then the graph's first step is close to eager's
    kinds = []
    for _ in range(6):
        kind = chooser.pick(1)
        chooser.record(1, kind, next(times))
        kinds.append(kind)
    assert kinds == [EAGER] * 3 + [GRAPH] * 3  # 0.020 is not 1.5x 0.018: the graph got its `least` steps


def test_an_exploration_of_cpu_helped_steps_is_not_cut_short_by_one_cold_step():
    """The graph decided; at the exploration the CPU's first step is cold (and slow), its next ones fast."""
    chooser = StepKindChooser(sample=8, explore_every=40, warmup=0, least=3, graph_warmup=0)
    drive(chooser, 39, {GRAPH: 0.018, EAGER: 0.034})
    assert chooser.best(1) == GRAPH
    times = iter([0.040, 0.012, 0.012, 0.012])
    kinds = []
    for _ in range(4):
        kind = chooser.pick(1)
        chooser.record(1, kind, next(times) if kind == EAGER else 0.018)
        kinds.append(kind)
    assert kinds[:3] == [EAGER] * 3 and chooser.best(1) == EAGER

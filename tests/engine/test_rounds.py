"""``rounds.measure_round`` driven by a fake ``measure`` and a real DOP rule: no processes, no TVM."""

import pytest

from bench.dop_presets import AdaptiveSample, ImmediateBackOff
from tuning.engine.doppler.doppler_rule import DopplerRule
from tuning.engine.doppler.platform_rule import (
    MeasuredNoise,
    PairsProbe,
    PlatformRule,
    PooledSample,
    ProbeStart,
    RankableOutliers,
    make_rule,
)
from tuning.engine.doppler.rounds import measure_round
from tuning.engine.measuring.measure import MeasureOutcome


class Measured(MeasuredNoise, DopplerRule):
    """DOPpler's rule judging its error above the measured serial noise."""


class ProbeFirst(ProbeStart, DopplerRule):
    """DOPpler's rule starting at the DOP a serial first round would have led to."""


class ProbePooled(ProbeStart, PooledSample, MeasuredNoise, DopplerRule):
    """Pooled pairs above the measured noise from a probe start; the probe DOPpler's 20 %."""


class ProbePooledPairs(ProbeStart, PairsProbe, PooledSample, MeasuredNoise, DopplerRule):
    """ProbePooled whose probe times the pooled rule's pairs."""


class ProbeMeasured(ProbeStart, MeasuredNoise, DopplerRule):
    """DOPpler's fixed 20 % sample above the measured noise, from a probe start."""


class AdaptiveMeasured(AdaptiveSample, MeasuredNoise, DopplerRule):
    """The halving sample above the measured noise."""


OUTLIER_RULES = {"rankable": type("Rankable", (RankableOutliers, DopplerRule), {}), "all": DopplerRule}
NOISE_RULES = {"measured": Measured, "none": DopplerRule}
BACK_OFF_RULES = {"confirmed": PlatformRule, "immediate": ImmediateBackOff}


class FakeMeasure:
    """Job ``i`` takes ``base[i]`` seconds serially and ``base[i] * slowdown`` at DOP > 1; jobs in
    ``fail_parallel`` fail at DOP > 1 only, jobs in ``fail_always`` everywhere. Records every call."""

    def __init__(self, base, *, slowdown=1.0, fail_parallel=(), fail_always=()):
        self.base, self.slowdown = list(base), slowdown
        self.fail_parallel, self.fail_always = set(fail_parallel), set(fail_always)
        self.calls: list[tuple[list[int], int]] = []

    def __call__(self, jobs, dop):
        self.calls.append((list(jobs), dop))
        out = []
        for j in jobs:
            if j in self.fail_always or (dop > 1 and j in self.fail_parallel):
                out.append((MeasureOutcome([], "run failed", f"w-d{dop}"), 0.01))
            else:
                secs = self.base[j] * (self.slowdown if dop > 1 else 1.0)
                out.append((MeasureOutcome([secs, secs], None, f"w-d{dop}"), 0.02))
        return out

    def measured_at(self, dop):
        return sorted(j for jobs, d in self.calls if d == dop for j in jobs)


def parallel_layout(dop):
    return dop == 1  # only DOP 1 is the serial configuration


def test_serial_configuration_measures_each_job_once():
    ctrl = DopplerRule(4)
    fake = FakeMeasure([1e-3, 2e-3, 3e-3])
    res = measure_round([0, 1, 2], fake, ctrl, is_serial_config=lambda d: True)
    assert fake.calls == [([0, 1, 2], 1)]
    assert [c.final_secs for c in res.candidates] == [[1e-3] * 2, [2e-3] * 2, [3e-3] * 2]
    assert res.n_remeasured == 0 and res.n_failures == 0 and not res.correction_applied
    assert res.decision.mean_error == 0.0 and res.warm_dop is None
    assert len(ctrl.history) == 1 and ctrl.dop > 1  # the serial round lets DOP grow


def test_small_error_is_corrected_and_the_dop_validated():
    ctrl = DopplerRule(4, initial_dop=2)
    base = [1e-3 * (1 + 0.01 * i) for i in range(10)]
    fake = FakeMeasure(base, slowdown=1.02)
    res = measure_round(list(range(10)), fake, ctrl, is_serial_config=parallel_layout, probe_first=False)
    assert res.dop == 2 and fake.measured_at(2) == list(range(10))
    sampled = [i for i, c in enumerate(res.candidates) if c.remeasured]
    assert sampled and fake.measured_at(1) == sampled
    assert abs(res.decision.mean_error - 0.02 / 1.02) < 1e-9 and not res.decision.backed_off
    assert res.correction_applied and 2 in res.validated
    for i, c in enumerate(res.candidates):
        assert c.dop == 2 and c.wall_secs == 0.02
        if c.remeasured:  # the serial number stands
            assert c.final_secs == [base[i]] * 2 and c.serial_latency_s == base[i]
        else:  # the parallel number corrected by (1 - mean error): back to the serial one
            assert abs(c.final_secs[0] - base[i]) < 1e-12
    assert res.warm_dop == ctrl.dop != 2


def test_a_probe_with_a_large_error_backs_off_and_measures_the_rest_serially_once():
    ctrl = DopplerRule(2, initial_dop=2)
    fake = FakeMeasure([1e-3] * 12, slowdown=2.0)
    res = measure_round(list(range(12)), fake, ctrl, is_serial_config=parallel_layout)
    probe = fake.measured_at(2)
    assert len(probe) == 4 == res.decision.n_sampled  # max(2 x DOP, ceil(0.2 x 12))
    assert res.decision.backed_off and res.decision.dop_after == 1 and 2 not in res.validated
    assert fake.measured_at(1) == list(range(12))  # the probe re-measured, the rest measured once
    assert res.n_remeasured == 4 and not res.correction_applied
    rest = [c for i, c in enumerate(res.candidates) if i not in probe]
    assert all(c.dop == 1 and not c.remeasured and c.final_secs == [1e-3] * 2 for c in rest)
    assert all(c.wall_secs is None for c in rest)  # serial-only measurements carry no wall time


def test_failures_caused_by_parallelism_are_remeasured_and_counted():
    ctrl = DopplerRule(4, initial_dop=2)
    fake = FakeMeasure([1e-3] * 8, fail_parallel={3}, fail_always={5})
    res = measure_round(list(range(8)), fake, ctrl, is_serial_config=parallel_layout, probe_first=False)
    assert {3, 5} <= set(fake.measured_at(1))
    assert res.decision.failures == 1  # job 3 failed only in parallel; job 5 fails everywhere
    c3, c5 = res.candidates[3], res.candidates[5]
    assert c3.remeasured and c3.final_secs == [1e-3] * 2 and c3.final_error is None
    assert c5.final_secs is None and c5.final_error == "run failed"
    assert res.n_failures == 1


@pytest.mark.parametrize("outliers", ["rankable", "all"])
def test_far_slow_outliers_are_not_timed_serially_unless_dopplers_rule_says_so(outliers):
    """A candidate 40x the round's median costs 40x the serial time and ranks last either way: the
    "rankable" rule leaves it as measured (corrected like the rest) and books it on the round's row."""
    ctrl = OUTLIER_RULES[outliers](2, initial_dop=2)
    base = [1e-3 * (1 + 0.01 * i) for i in range(15)] + [40e-3]
    fake = FakeMeasure(base)
    res = measure_round(list(range(16)), fake, ctrl, is_serial_config=parallel_layout, validated={2})
    assert fake.calls[0] == (list(range(16)), 2)
    slow = res.candidates[15]
    if outliers == "rankable":
        assert 15 not in fake.measured_at(1) and not slow.remeasured
        assert slow.final_secs == pytest.approx([40e-3] * 2)  # kept (error 0: corrected by nothing)
        assert ctrl.history[-1].outliers_skipped == 1
    else:
        assert 15 in fake.measured_at(1) and slow.remeasured
        assert ctrl.history[-1].outliers_skipped == 0
    assert 0 in fake.measured_at(1)  # the fastest is always re-measured


def test_a_probes_rest_leaves_far_slow_outliers_as_measured():
    ctrl = OUTLIER_RULES["rankable"](2, initial_dop=2)
    base = [1e-3 * (1 + 0.01 * i) for i in range(16)]
    base[13] = 40e-3  # not in the probe (0, 4, 8, 12)
    fake = FakeMeasure(base)
    res = measure_round(list(range(16)), fake, ctrl, is_serial_config=parallel_layout)
    assert fake.calls[0] == ([0, 4, 8, 12], 2) and 2 in res.validated
    assert 13 not in fake.measured_at(1) and ctrl.history[-1].outliers_skipped == 1


def test_validated_dop_skips_the_probe_and_the_input_set_is_left_alone():
    ctrl = DopplerRule(4, initial_dop=2)
    fake = FakeMeasure([1e-3] * 12)
    before = {2}
    res = measure_round(list(range(12)), fake, ctrl, is_serial_config=parallel_layout, validated=before)
    assert fake.calls[0] == (list(range(12)), 2)  # no probe: the whole round at DOP 2
    assert before == {2} and res.validated == {2}


def test_probe_start_validates_the_first_parallel_dop_without_a_serial_round():
    """A probe start (ProbeStart): the first round measures at the DOP a serial round would have led to; its
    probe is re-measured serially before the rest, and a good probe keeps the DOP for the rest."""
    ctrl = ProbeFirst(2)
    assert ctrl.dop == 2
    base = [1e-3 * (1 + 0.01 * i) for i in range(16)]
    fake = FakeMeasure(base, slowdown=1.01)
    res = measure_round(list(range(16)), fake, ctrl, is_serial_config=parallel_layout)
    probe = [i for i, c in enumerate(res.candidates) if c.remeasured]
    assert res.dop == 2 and 2 in res.validated and not res.decision.backed_off
    assert fake.measured_at(2) == list(range(16))  # everything measured in parallel once
    assert fake.measured_at(1) == probe and len(probe) < 16 // 2  # only the probe serially


def test_probe_start_with_a_bad_probe_measures_the_rest_serially():
    ctrl = ProbeFirst(2)
    base = [1e-3 * (1 + 0.01 * i) for i in range(16)]
    fake = FakeMeasure(base, slowdown=1.5)  # interference: parallel numbers are 50 % off
    res = measure_round(list(range(16)), fake, ctrl, is_serial_config=parallel_layout)
    assert res.decision.backed_off and ctrl.dop == 1 and 2 not in res.validated
    probe = set(fake.measured_at(2))
    assert probe and len(probe) < 16 // 2
    assert fake.measured_at(1) == list(range(16))  # the probe re-measured, the rest measured serially
    for c in res.candidates:  # every answer is a serial number
        assert c.final_secs is not None and c.final_secs[0] in base


def test_a_probe_start_is_where_a_serial_first_round_would_have_led():
    assert ProbeFirst(16).dop == 8  # 1 + the rule's largest step (7)
    assert DopplerRule(16).dop == 1  # DOPpler's start
    assert make_rule(1, 16).dop == 1  # a fixed DOP stays fixed


class JitteryMeasure(FakeMeasure):
    """Like FakeMeasure, but a job's serial timings alternate base x (1 + jitter), base x (1 - jitter):
    a host where one serial timing differs from the next by about 2 x jitter."""

    def __init__(self, base, *, jitter, **kw):
        super().__init__(base, **kw)
        self.jitter, self.serial_count = jitter, {}

    def __call__(self, jobs, dop):
        out = super().__call__(jobs, dop)
        if dop > 1:
            return out
        for k, j in enumerate(jobs):
            n = self.serial_count[j] = self.serial_count.get(j, 0) + 1
            secs = self.base[j] * (1 + self.jitter if n % 2 else 1 - self.jitter)
            out[k] = (MeasureOutcome([secs, secs], None, "w-d1"), 0.02)
        return out


def _noisy_round(noise, slowdown):
    ctrl = NOISE_RULES[noise](4, initial_dop=2)
    fake = JitteryMeasure([1e-3 * (1 + 0.01 * i) for i in range(16)], jitter=0.08, slowdown=slowdown)
    res = measure_round(list(range(16)), fake, ctrl, is_serial_config=parallel_layout, probe_first=False)
    return ctrl, fake, res


def test_measured_serial_noise_keeps_a_dop_whose_timings_are_no_worse_than_serial_repeats():
    # parallel timings are exact, serial ones jitter by 8 %: DOPpler's rule blames parallelism
    ctrl, fake, res = _noisy_round("none", slowdown=1.0)
    assert res.decision.mean_error > 0.05 and res.decision.backed_off and ctrl.dop == 1
    ctrl, fake, res = _noisy_round("measured", slowdown=1.0)
    assert not res.decision.backed_off and ctrl.dop >= 2 and 2 in res.validated
    noise = ctrl.history[-1].serial_noise
    assert abs(noise - 0.16 / 1.08) < 1e-9 and res.decision.serial_noise == noise
    # one sampled candidate, the fastest, was timed serially twice and keeps both timings
    sampled = [i for i, c in enumerate(res.candidates) if c.remeasured]
    twice = [j for j in set(fake.measured_at(1)) if fake.measured_at(1).count(j) == 2]
    assert twice == [min(sampled, key=lambda i: res.candidates[i].serial_latency_s)]
    assert len(res.candidates[twice[0]].final_secs) == 4


def test_measured_serial_noise_still_backs_off_on_real_interference():
    ctrl, fake, res = _noisy_round("measured", slowdown=1.5)  # 50 % slower in parallel
    assert ctrl.serial_noise is not None
    # one noise pair of 15 % leaves a wide allowance, but a bias past the correction limit backs off anyway
    assert res.decision.mean_error < ctrl.allowed_error(res.decision.errors)
    assert res.decision.mean_signed_error > ctrl.settings.correction_limit
    assert res.decision.backed_off and ctrl.dop == 1 and "uncorrectable" in res.serial_by_reason


def test_a_probe_times_two_of_its_candidates_twice_serially():
    ctrl = Measured(2, initial_dop=2)
    fake = JitteryMeasure([1e-3] * 12, jitter=0.08)
    res = measure_round(list(range(12)), fake, ctrl, is_serial_config=parallel_layout)
    probe = fake.calls[0][0]  # the first call: the probe, in parallel
    assert len(ctrl.noise_errors) == 2 and len(probe) == 4
    assert not res.decision.backed_off and 2 in res.validated


@pytest.fixture
def clocked(monkeypatch):
    """A FakeMeasure class on a fake clock: one second per job measured serially, half a second in parallel."""
    import tuning.engine.doppler.rounds as rounds

    clock = [0.0]
    monkeypatch.setattr(rounds.time, "perf_counter", lambda: clock[0])

    class Clocked(FakeMeasure):
        def __call__(self, jobs, dop):
            clock[0] += len(jobs) * (1.0 if dop == 1 else 0.5)
            return super().__call__(jobs, dop)

    return Clocked


def test_round_wall_time_is_split_between_its_dop_and_the_serial_sample(clocked):
    """The round's measuring time is booked to the DOP it measured at or to the serial re-measures,
    call by call (on the fake clock)."""
    Clocked = clocked
    ctrl = DopplerRule(4, initial_dop=2)
    fake = Clocked([1e-3 * (1 + 0.01 * i) for i in range(10)], slowdown=1.02)
    res = measure_round(list(range(10)), fake, ctrl, is_serial_config=parallel_layout, probe_first=False)
    serial_jobs = len(fake.measured_at(1))
    assert serial_jobs > 0
    assert res.parallel_wall_s == 10 * 0.5
    assert res.serial_wall_s == serial_jobs * 1.0

    ctrl1 = DopplerRule(1)
    res1 = measure_round([0, 1, 2], Clocked([1e-3] * 3), ctrl1, is_serial_config=lambda d: True)
    assert res1.parallel_wall_s == 3.0 and res1.serial_wall_s == 0.0  # a DOP 1 round has no sample


def test_serial_time_is_booked_to_why_it_was_spent(clocked):
    """The serial share of a round says what it paid for: DOPpler's sample (with the parallel failures
    among it), the noise pairs, the probe, or the rest of a round whose error was past correction_limit
    (on the fake clock)."""
    import tuning.engine.doppler.rounds as rounds

    Clocked = clocked
    # a validated DOP whose parallel timings are 40 % slow: past correction_limit 0.25, the whole rest
    # of the round is timed serially too
    ctrl = Measured(2, initial_dop=2)
    fake = Clocked([1e-3 * (1 + 0.01 * i) for i in range(10)], slowdown=1.0 / 0.6, fail_parallel={9})
    res = measure_round(list(range(10)), fake, ctrl, is_serial_config=parallel_layout, probe_first=False)
    by = res.serial_by_reason
    assert set(by) == {"sample", "noise", "uncorrectable"}, by
    assert by["sample"]["failed"] == 1  # job 9 was re-timed because it failed in parallel
    assert by["noise"]["n"] == 1
    assert by["sample"]["n"] + by["uncorrectable"]["n"] == 10  # every candidate timed serially once
    assert sum(row["secs"] for row in by.values()) == res.serial_wall_s == sum(row["n"] for row in by.values())

    # a probe of a DOP not validated yet books its serial timings to "probe"; the totals add up over rounds
    ctrl2 = Measured(2, initial_dop=2)
    res2 = measure_round(list(range(12)), Clocked([1e-3] * 12), ctrl2, is_serial_config=parallel_layout)
    assert res2.serial_by_reason["probe"]["n"] == 4 and res2.serial_by_reason["noise"]["n"] == 2
    total = rounds.serial_totals([res, res2])
    assert total["noise"]["n"] == 3 and total["sample"]["failed"] == 1 and total["probe"]["secs"] == 4.0


@pytest.mark.parametrize("outliers", ["rankable", "all"])
def test_an_uncorrectable_round_times_its_rest_serially_but_for_far_slow_candidates(outliers):
    """Parallel timings 40 % slow (past correction_limit): the rest of the round is timed serially, except,
    under "rankable", the candidates past DOP x the round's median, which rank last whatever they take."""
    ctrl = OUTLIER_RULES[outliers](2, initial_dop=2)
    base = [1e-3 * (1 + 0.01 * i) for i in range(14)] + [40e-3, 50e-3]
    fake = FakeMeasure(base, slowdown=1.0 / 0.6)
    res = measure_round(list(range(16)), fake, ctrl, is_serial_config=parallel_layout, validated={2})
    assert res.decision.backed_off and not res.correction_applied
    assert res.serial_by_reason["uncorrectable"]["n"] > 0
    timed = set(fake.measured_at(1))
    assert set(range(14)) <= timed  # every candidate that could rank before the median has a serial timing
    if outliers == "rankable":
        assert not timed & {14, 15} and ctrl.history[-1].outliers_skipped == 2
        assert res.candidates[15].final_secs == pytest.approx([50e-3 / 0.6] * 2)  # as measured in parallel
    else:
        assert {14, 15} <= timed and ctrl.history[-1].outliers_skipped == 0


class GlitchMeasure(FakeMeasure):
    """Like FakeMeasure, but job ``glitch``'s first serial timing comes out ``factor`` x slow."""

    def __init__(self, base, *, glitch, factor, **kw):
        super().__init__(base, **kw)
        self.glitch, self.factor, self.glitched = glitch, factor, False

    def __call__(self, jobs, dop):
        out = super().__call__(jobs, dop)
        if dop == 1 and self.glitch in jobs and not self.glitched:
            self.glitched = True
            secs = self.base[self.glitch] * self.factor
            out[list(jobs).index(self.glitch)] = (MeasureOutcome([secs, secs], None, "w-d1"), 0.02)
        return out


def _calm_then(fake2, rule=AdaptiveMeasured):
    """A calm round that shrinks the adaptive sample, then a round measured by ``fake2``."""
    ctrl = rule(2, initial_dop=2)
    base = [1e-3 * (1 + 0.01 * i) for i in range(16)]
    measure_round(list(range(16)), FakeMeasure(base), ctrl, is_serial_config=parallel_layout, validated={2})
    shrunk = ctrl.share
    res = measure_round(list(range(16)), fake2(base), ctrl, is_serial_config=parallel_layout, validated={2})
    return ctrl, shrunk, res


def test_a_shrunk_sample_with_an_uncorrectable_error_is_topped_up_before_the_round_decides():
    # one glitched serial timing (1.8x) in a 2-candidate sample reads as a -0.4 error: past correction
    # limit; topped up to 4 candidates it is -0.2, and the rest is corrected instead of timed serially
    ctrl, shrunk, res = _calm_then(lambda b: GlitchMeasure(b, glitch=0, factor=1.8))
    assert shrunk < ctrl.settings.sample_share
    assert ctrl.history[-1].sample_topped_up == 2 and res.decision.n_sampled == 4
    assert res.decision.mean_signed_error == pytest.approx(-0.2)
    assert "uncorrectable" not in res.serial_by_reason and res.correction_applied
    assert res.serial_by_reason["sample"]["n"] == 4

    # a real error survives the top-up: the rest is still timed serially
    ctrl, _, res = _calm_then(lambda b: FakeMeasure(b, slowdown=1.0 / 0.6))
    assert ctrl.history[-1].sample_topped_up == 2
    assert res.serial_by_reason["uncorrectable"]["n"] == 16 - 4 and not res.correction_applied

    # a correctable glitch that would back the DOP off from two timings is topped up too: from four, the
    # error is within the allowance and the round keeps DOP 2
    ctrl, _, res = _calm_then(lambda b: GlitchMeasure(b, glitch=0, factor=1.28))
    assert ctrl.history[-1].sample_topped_up == 2 and res.decision.n_sampled == 4
    assert res.decision.mean_error == pytest.approx(0.07) and not res.decision.backed_off and ctrl.dop == 2
    assert "uncorrectable" not in res.serial_by_reason and res.correction_applied

    # DOPpler's fixed sample never shrinks, so there is nothing to top up
    ctrl, shrunk, res = _calm_then(lambda b: GlitchMeasure(b, glitch=0, factor=1.8), rule=Measured)
    assert shrunk == ctrl.settings.sample_share and ctrl.history[-1].sample_topped_up == 0


def _pooled_after_probe(fake):
    """A calm probe round (4 pairs, 1 noise pair) under the pooled sample, then a round measured by ``fake``."""
    ctrl = ProbePooled(2)
    base = [1e-3 * (1 + 0.01 * i) for i in range(16)]
    first = measure_round(list(range(16)), FakeMeasure(base), ctrl, is_serial_config=parallel_layout)
    assert ctrl.history[-1].n_pooled == 4 and len(ctrl.pairs) == 4 and ctrl.share == 0.0
    assert first.serial_by_reason["noise"]["n"] == 1
    fake = fake(base)
    res = measure_round(list(range(16)), fake, ctrl, is_serial_config=parallel_layout, validated=first.validated)
    return ctrl, fake, res


def test_a_pooled_round_re_times_its_fastest_and_decides_on_the_recent_rounds_pairs():
    ctrl, fake, res = _pooled_after_probe(lambda b: FakeMeasure(b, slowdown=1.02))
    assert fake.calls[0] == (list(range(16)), 2)  # the whole round in parallel
    # the fastest alone, timed twice: 1 noise pair known after the probe, 2 wanted
    assert fake.measured_at(1) == [0, 0] and ctrl.history[-1].n_sampled == 1
    assert ctrl.history[-1].n_pooled == 5 and res.decision.n_sampled == 1
    # pooled mean error: the probe's four exact pairs and this round's 2 % one
    assert res.decision.mean_error == pytest.approx(0.02 / 1.02 / 5)
    assert not res.decision.backed_off and ctrl.dop == 2 and res.correction_applied
    # one round later: two noise pairs known, so the fastest is timed serially once
    res2 = measure_round(list(range(16)), FakeMeasure(list(fake.base), slowdown=1.02), ctrl,
                         is_serial_config=parallel_layout, validated=res.validated)
    assert res2.serial_by_reason == {"sample": {"n": 1, "secs": pytest.approx(res2.serial_wall_s)}}
    assert ctrl.history[-1].n_pooled == 6


def test_a_pooled_round_whose_own_pair_shows_real_interference_tops_up_and_decides_alone():
    ctrl, fake, res = _pooled_after_probe(lambda b: FakeMeasure(b, slowdown=1.0 / 0.6))  # 40 % slow now
    assert ctrl.history[-1].sample_topped_up == 3 and res.decision.n_sampled == 4
    assert ctrl.history[-1].n_pooled == 4  # the probe's calm pairs were dropped, not averaged in
    assert res.decision.backed_off and ctrl.dop == 1 and ctrl.pairs == []
    assert "uncorrectable" in res.serial_by_reason and not res.correction_applied
    assert ctrl.share == ctrl.settings.sample_share  # the next parallel round samples in full again


def test_a_pooled_round_whose_own_pair_glitched_is_topped_up_and_kept_by_the_pooled_pairs():
    # the fastest's serial timing glitches 1.28x: past correction on its own; topped up, the round's own
    # four pairs stay within the allowance, and the decision pools them with the probe's four
    ctrl, fake, res = _pooled_after_probe(lambda b: GlitchMeasure(b, glitch=0, factor=1.28))
    assert ctrl.history[-1].sample_topped_up == 3 and ctrl.history[-1].n_pooled == 8
    assert res.decision.mean_signed_error == pytest.approx(-0.28 / 8)
    assert not res.decision.backed_off and ctrl.dop == 2 and res.correction_applied
    assert "uncorrectable" not in res.serial_by_reason and len(ctrl.pairs) == 8


def test_pooled_pairs_restart_when_the_dop_changes():
    ctrl = ProbePooled(16)
    assert ctrl.dop == 8
    res = measure_round(list(range(32)), FakeMeasure([1e-3] * 32), ctrl, is_serial_config=parallel_layout)
    assert not res.decision.backed_off and ctrl.dop > 8  # a calm probe raises the DOP
    assert ctrl.pairs == [] and ctrl.share == ctrl.settings.sample_share  # pairs of DOP 8 say nothing about DOP 12


class FirstSerialSlow(FakeMeasure):
    """Like FakeMeasure, but the first serial timing of each job in ``slow`` comes out ``slow[job]`` x slow
    (a serial timing glitched by the host, not by parallelism)."""

    def __init__(self, base, *, slow, **kw):
        super().__init__(base, **kw)
        self.slow, self.timed_serially = dict(slow), set()

    def __call__(self, jobs, dop):
        out = super().__call__(jobs, dop)
        if dop == 1:
            for k, j in enumerate(jobs):
                if j in self.slow and j not in self.timed_serially:
                    secs = self.base[j] * self.slow[j]
                    out[k] = (MeasureOutcome([secs, secs], None, "w-d1"), 0.02)
                self.timed_serially.add(j)
        return out


@pytest.mark.parametrize("back_off", ["confirmed", "immediate"])
def test_a_probe_about_to_back_off_on_glitched_serial_timings_times_them_again_first(back_off):
    """Two of the probe's four first serial timings come out 1.8x slow (the host, not parallelism): a -0.4
    bias, past correction_limit. Confirmed (the platform's rule), the probe is timed serially once more,
    the references become the mean of two timings (-0.2 bias, noise pairs of 0.44) and DOP 2 stays;
    DOPpler's immediate rule backs off to DOP 1."""
    ctrl = BACK_OFF_RULES[back_off](2)
    base = [1e-3 * (1 + 0.01 * i) for i in range(16)]
    fake = FirstSerialSlow(base, slow={4: 1.8, 8: 1.8})
    res = measure_round(list(range(16)), fake, ctrl, is_serial_config=parallel_layout)
    assert fake.calls[0] == ([0, 4, 8, 12], 2)
    if back_off == "confirmed":
        # the noise pair (the fastest, job 0) already has its second timing: the other three get theirs
        assert res.serial_by_reason["confirm"]["n"] == 3 and len(ctrl.noise_errors) == 4
        assert res.candidates[4].serial_reference_s == pytest.approx(1.4 * base[4])
        assert res.decision.mean_signed_error == pytest.approx(-0.2)
        assert not res.decision.backed_off and ctrl.dop == 2 and 2 in res.validated and res.correction_applied
        assert len(res.candidates[4].final_secs) == 4  # both serial timings' samples
    else:
        assert "confirm" not in res.serial_by_reason and res.decision.mean_signed_error == pytest.approx(-0.4)
        assert res.decision.backed_off and ctrl.dop == 1 and 2 not in res.validated


def test_real_interference_backs_off_after_the_second_look():
    """Parallel timings 40 % slow stay slow however often the serial ones are taken: the probe, and a
    sampled round of a validated DOP, back off after their second serial look."""
    base = [1e-3 * (1 + 0.01 * i) for i in range(16)]
    ctrl = make_rule("auto", 2)
    res = measure_round(list(range(16)), FakeMeasure(base, slowdown=1.0 / 0.6), ctrl, is_serial_config=parallel_layout)
    assert res.serial_by_reason["confirm"]["n"] == 3
    assert res.decision.mean_signed_error == pytest.approx(0.4) and res.decision.backed_off and ctrl.dop == 1

    ctrl = make_rule("auto", 2)
    fake = FakeMeasure(base, slowdown=1.0 / 0.6)
    res = measure_round(list(range(16)), fake, ctrl, is_serial_config=parallel_layout, validated={2})
    sample = [i for i, c in enumerate(res.candidates) if c.serial_repeat_s is not None]
    assert len(sample) == res.decision.n_sampled == 4  # 20 % of the good ones, each timed serially twice
    assert res.serial_by_reason["confirm"]["n"] == 3 and res.serial_by_reason["noise"]["n"] == 1
    assert res.decision.backed_off and ctrl.dop == 1 and "uncorrectable" in res.serial_by_reason


def test_a_calm_round_takes_no_second_look():
    ctrl = make_rule("auto", 2)
    res = measure_round(list(range(16)), FakeMeasure([1e-3] * 16, slowdown=1.02), ctrl,
                        is_serial_config=parallel_layout)
    assert "confirm" not in res.serial_by_reason and not res.decision.backed_off


@pytest.mark.parametrize("rule, max_dop, probed", [
    (ProbePooledPairs, 2, 4), (ProbePooledPairs, 4, 8), (ProbePooled, 2, 7), (ProbeMeasured, 2, 7)])
def test_a_pooled_probe_times_the_pairs_the_pooled_rule_decides_on_not_a_fifth_of_the_round(rule, max_dop, probed):
    """A round of 32: DOPpler's probe is 20 % of it (7), the pooled rule's is its min_pooled_pairs (4), two
    per slot at least (8 at DOP 4); the probe's pairs fill the window the next rounds add to."""
    ctrl = rule(max_dop, initial_dop=max_dop)
    fake = FakeMeasure([1e-3 * (1 + 0.01 * i) for i in range(32)])
    res = measure_round(list(range(32)), fake, ctrl, is_serial_config=parallel_layout)
    assert len(fake.calls[0][0]) == probed and fake.calls[0][1] == max_dop
    assert res.serial_by_reason["probe"]["n"] == probed == res.decision.n_sampled
    assert not res.decision.backed_off and max_dop in res.validated
    if probed == 4:
        assert len(ctrl.pairs) == probed and ctrl.share == 0.0  # the next round re-times its fastest alone


def _confirmed_pooled_after_probe(fake):
    """The platform's rule (pooled, measured noise, confirmed back-off) after a calm probe."""
    ctrl = make_rule("auto", 2)
    base = [1e-3 * (1 + 0.01 * i) for i in range(32)]
    first = measure_round(list(range(32)), FakeMeasure(base), ctrl, is_serial_config=parallel_layout)
    assert ctrl.share == 0.0 and len(ctrl.pairs) == 4
    return ctrl, measure_round(list(range(32)), fake(base), ctrl, is_serial_config=parallel_layout,
                               validated=first.validated)


def test_a_shrunk_sample_contested_by_one_glitched_serial_timing_takes_a_second_look_instead_of_a_top_up():
    # the fastest's first serial timing comes out 1.28x (the host): alone it contests the round; its second
    # serial timing (1.0x) is one timing where the top-up was 6, and the mean of the two no longer contests
    ctrl, res = _confirmed_pooled_after_probe(lambda b: GlitchMeasure(b, glitch=0, factor=1.28))
    assert res.serial_by_reason["confirm"]["n"] == 1 and res.serial_by_reason["sample"]["n"] == 1
    assert ctrl.history[-1].sample_topped_up == 0 and ctrl.history[-1].n_pooled == 5
    assert res.candidates[0].serial_reference_s == pytest.approx(1.14e-3)
    assert not res.decision.backed_off and ctrl.dop == 2 and res.correction_applied


def test_real_interference_survives_the_second_look_and_is_topped_up_and_backs_off():
    ctrl, res = _confirmed_pooled_after_probe(lambda b: FakeMeasure(b, slowdown=1.0 / 0.6))  # 40 % slow now
    assert res.serial_by_reason["confirm"]["n"] >= 1 and ctrl.history[-1].sample_topped_up > 0
    assert res.decision.backed_off and ctrl.dop == 1 and "uncorrectable" in res.serial_by_reason


def test_the_whole_run_replay_charges_the_platform_rule_fewer_serial_timings_than_dopplers_sample(tmp_path):
    """bench/probe_back_offs.py --rows-from: recorded per-slot timings (here: a calm host, parallel 1 % slow)
    replayed as whole runs through the engine's round and rules, each of DOPpler's choices put back."""
    import json

    from bench import probe_back_offs

    rows = [{"pass": 0, "candidate": i, "t": 0.0, "s0": 1e-3 * (1 + 0.02 * i), "s1": 1e-3 * (1 + 0.02 * i),
             "p0": 1.01e-3 * (1 + 0.02 * i), "p1": 1.01e-3 * (1 + 0.02 * i), "s0b": 1.002e-3 * (1 + 0.02 * i)}
            for i in range(16)]
    src, out = tmp_path / "rows.json", tmp_path / "out.json"
    src.write_text(json.dumps({"rows": rows, "settings": {"workload": "matmul512", "candidates": 16}}))
    assert probe_back_offs.main(["--rows-from", str(src), "--runs", "3", "--replays", "10", "--json", str(out)]) == 0
    overall = json.loads(out.read_text())["overall"]
    assert overall["run_rounds_above_dop1_platform"] == 6 == overall["run_rounds_above_dop1_fixed_sample"]
    # the platform's: a probe of 4 (+1 noise pair), then the fastest of each round (+1 noise pair): 4+1+5+1
    assert overall["run_serial_timings_platform"] == 11
    assert overall["run_serial_timings_share_probe"] == 11 + 3  # DOPpler's probe: 7 of 32
    assert overall["run_serial_timings_fixed_sample"] > 2 * overall["run_serial_timings_platform"]
    src.write_text(json.dumps({"benchmark": "tuning_time"}))  # not rows this script wrote: said, not a traceback
    assert probe_back_offs.main(["--rows-from", str(src), "--runs", "1"]) == 2

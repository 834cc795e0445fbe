"""The DOP rules on synthetic latencies (pure, no TVM): DOPpler's, the platform's refinements, a fixed DOP."""

import math

import pytest

from bench.dop_presets import AdaptiveSample, FixedSample, ImmediateBackOff, ShareProbe
from tuning.engine.doppler.doppler_rule import DopplerRule
from tuning.engine.doppler.platform_rule import (
    ConfirmedBackOff,
    MeasuredNoise,
    PlatformRule,
    PooledSample,
    ProbeStart,
    RankableOutliers,
    make_rule,
)
from tuning.engine.doppler.plan import DopSettings
from tuning.engine.doppler.rule import FixedDop, robust_z_scores


class Measured(MeasuredNoise, DopplerRule):
    """DOPpler's rule judging its error above the measured serial noise."""


class Rankable(RankableOutliers, DopplerRule):
    """DOPpler's rule leaving far slow outliers as measured."""


class AdaptiveFromProbe(ProbeStart, AdaptiveSample, DopplerRule):
    """The halving sample from a probe start, DOPpler's rule otherwise."""


class FixedFromProbe(ProbeStart, DopplerRule):
    """DOPpler's 20 % every round from a probe start."""


class Pooled(PooledSample, MeasuredNoise, DopplerRule):
    """Pooled pairs above the measured noise."""


def _sample(rule, latencies, dop=1):
    return rule.serial_sample(latencies, dop)[0]

HALF_NORMAL_SD = math.sqrt(math.pi / 2 - 1)  # sd / mean of the absolute value of a centred normal


def test_starts_at_one_and_grows_by_clamped_step():
    c = DopplerRule(64)
    assert c.dop == 1
    d = c.decide([1.0, 2.0], [1.0, 2.0])  # zero error
    # (128 - 1) / 2 = 63.5 -> step clamped to 7
    assert (d.dop_before, d.dop_after) == (1, 8)
    c.decide([1.0], [1.01])  # 1 % error < 5 %
    assert c.dop == 15


def test_minimum_growth_step_is_two():
    c = DopplerRule(64, initial_dop=9, settings=DopSettings(cap=10))
    c.decide([1.0], [1.0])
    assert c.dop == 10  # step max((10-9)/2, 2) = 2 but capped at cap 10


def test_back_off_on_large_error():
    c = DopplerRule(64, initial_dop=20)
    d = c.decide([1.0, 1.0], [0.8, 0.8])  # 20 % error
    assert d.backed_off
    assert d.dop_after == 16  # 0.8 x 20
    assert c.cap == pytest.approx(18.0)  # 0.9 x 20
    # growth now stays under the new cap
    c.decide([1.0], [1.0])
    assert c.dop == 18


def test_back_off_at_cap_keeps_cap():
    c = DopplerRule(64, initial_dop=10, settings=DopSettings(cap=10))
    c.decide([1.0], [0.5])
    assert c.cap == 10 and c.dop == 8


def test_back_off_on_failures_caused_by_parallelism():
    c = DopplerRule(64, initial_dop=40)
    d = c.decide([1.0], [1.0], failures=3)  # 3 > 0.05 x 40 = 2
    assert d.backed_off and c.dop == 32
    c2 = DopplerRule(64, initial_dop=40)
    c2.decide([1.0], [1.0], failures=2)  # not above 5 % of DOP
    assert c2.dop > 40


def test_clamped_to_max_dop_and_cap():
    c = DopplerRule(2)
    c.decide([1.0], [1.0])
    assert c.dop == 2
    c.decide([1.0], [1.0])
    assert c.dop == 2
    c = DopplerRule(64, initial_dop=100, settings=DopSettings(cap=4))
    assert c.dop == 4


def test_noisy_probe_backs_off_then_reprobes_on_a_bounded_schedule():
    """One noisy probe (a loaded host) sends DOP back to 1; parallelism is tried again after
    ``reprobe_after`` rounds, then twice as many, and at most ``max_reprobes`` times."""
    c = DopplerRule(2, settings=DopSettings(reprobe_after=2, max_reprobes=2))
    c.decide_serial_round()
    assert c.dop == 2
    d = c.decide([2.0, 2.1, 1.9], [1.0, 1.05, 0.95])  # noisy: error 0.5
    assert d.backed_off and d.mean_error == pytest.approx(0.5) and c.dop == 1
    c.decide_serial_round()
    assert c.dop == 1
    c.decide_serial_round()
    assert c.dop == 2 and c.history[-1].reprobe  # 2 rounds at DOP 1, then re-probe
    c.decide([1.0, 1.5], [0.5, 1.0])  # still noisy -> back to 1, next wait 4 rounds
    assert c.dop == 1
    for _ in range(3):
        c.decide_serial_round()
        assert c.dop == 1
    c.decide_serial_round()
    assert c.dop == 2
    c.decide([1.0], [0.5])  # third noisy probe: re-probes used up
    for _ in range(10):
        c.decide_serial_round()
        assert c.dop == 1
    assert [h.dop for h in c.history][:6] == [1, 2, 1, 1, 2, 1]
    # the run's figure is the median of the probes' errors (tuning.engine.doppler.parallel_error), a fraction
    assert c.mean_parallel_error() == pytest.approx(sorted([0.5, (0.5 + 1 / 3) / 2, 0.5])[1])


def test_recovers_after_a_noisy_probe_when_the_noise_is_gone():
    c = DopplerRule(4, settings=DopSettings(reprobe_after=1))
    c.decide_serial_round()
    assert c.dop == 4
    for dop_after in (3, 2, 1):  # noisy rounds: DOP x 0.8, cap 0.9 x DOP each time
        c.decide([1.0], [0.5])
        assert c.dop == dop_after
    assert c.cap < 2
    c.decide_serial_round()
    assert c.dop == 2 and c.cap == c.settings.cap
    c.decide([1.0, 2.0], [1.0, 2.01])  # quiet now: DOP keeps growing
    assert c.dop == 4


def test_correction_only_below_limit():
    c = DopplerRule()
    assert c.correct([1.0, 2.0], 0.1) == pytest.approx([0.9, 1.8])
    assert c.correct([1.0, 2.0], 0.3) == [1.0, 2.0]
    assert c.correct([1.0], None) == [1.0]
    d = c.decide([1.0, 1.0], [0.9, 0.9], latencies=[2.0, 4.0])
    assert d.correction_applied
    assert d.corrected_latencies == pytest.approx([1.8, 3.6])


def test_signed_error_does_not_push_the_wrong_way():
    c = DopplerRule()
    d = c.decide([1.0, 1.0], [1.1, 1.1], latencies=[2.0])
    assert d.mean_error == pytest.approx(0.1)
    assert d.mean_signed_error == pytest.approx(-0.1)
    assert d.corrected_latencies == pytest.approx([2.2])


def test_robust_z_double_mad():
    z = robust_z_scores([1, 2, 3, 4, 100])
    assert abs(z[-1]) > 3 and all(abs(v) < 3 for v in z[:-1])
    # asymmetric spread: the lower side uses the lower MAD
    z = robust_z_scores([10, 10.1, 10.2, 10.3, 10.4, 13, 16])
    assert z[0] < 0 < z[-1]
    assert robust_z_scores([5, 5, 5]) == [0.0, 0.0, 0.0]
    assert math.isinf(robust_z_scores([5, 5, 5, 6])[-1])


def test_select_outliers_plus_twenty_percent_of_good():
    c = DopplerRule()
    lat = [1.0 + 0.01 * i for i in range(20)] + [50.0]
    idx = _sample(c, lat)
    assert 20 in idx  # the outlier
    good = [i for i in idx if i != 20]
    assert len(good) == 4  # ceil(0.2 x 20)
    assert 0 in good  # always the fastest good candidate
    # failures are never selected here
    assert _sample(c, [None, float("inf"), 1e10, 1.0]) == [3]
    assert _sample(c, []) == []


def test_rankable_outliers_leave_far_slow_ones_as_measured():
    lat = [1.0 + 0.01 * i for i in range(20)] + [0.2, 1.8, 50.0]  # a fast outlier, a near and a far slow one
    c = Rankable()
    keep, skip = c.split_outliers(lat, dop=2)
    assert keep == [20, 21] and skip == [22]  # 50 is past 2 x the median (about 1.1): ranked out either way
    assert 22 not in _sample(c, lat, dop=2)
    assert {20, 21} <= set(_sample(c, lat, dop=2))
    # a higher DOP could have slowed a candidate more, so the bound grows with it
    assert c.split_outliers([1.0] * 10 + [3.0], dop=2) == ([], [10])
    assert c.split_outliers([1.0] * 10 + [3.0], dop=4) == ([10], [])
    # at DOP 1 there is no interference to rank out, and DOPpler's rule re-measures every outlier
    assert c.split_outliers(lat, dop=1) == ([20, 21, 22], [])
    assert DopplerRule().split_outliers(lat, dop=2) == ([20, 21, 22], [])
    platform = make_rule("auto", 2)
    assert isinstance(platform, PlatformRule) and isinstance(platform, RankableOutliers)
    assert isinstance(platform, PooledSample)  # the platform's sample rule


def test_fixed_dop_records_error_but_does_not_adapt():
    c = FixedDop(2, 4)
    d = c.decide([1.0], [0.5])
    assert c.dop == 2 and d.mean_error == pytest.approx(0.5) and not d.backed_off
    assert c.history[-1].n_sampled == 1


def _good_count(c, n: int = 32) -> int:
    return len(_sample(c, [1.0 + 0.001 * i for i in range(n)]))


def test_adaptive_sample_shrinks_after_calm_rounds_and_restores_after_a_noisy_one():
    c = AdaptiveFromProbe(2)
    assert c.dop == 2 and _good_count(c) == 7  # ceil(0.2 x 32): DOPpler's share on a fresh DOP
    c.decide([1.0, 1.0], [0.99, 1.0])  # error 0.5 %: calm, DOP stays at the 2-slot maximum
    assert c.history[-1].sample_share == pytest.approx(0.2)
    assert _good_count(c) == 4  # halved: ceil(0.1 x 32), the floor
    c.decide([1.0, 1.0], [0.99, 1.0])
    assert _good_count(c) == 4  # never under min_sample_share
    c.decide([1.0, 1.0], [0.96, 0.96])  # 4 %: under the 5 % threshold, not calm (over half of it)
    assert c.dop == 2 and not c.history[-1].dop_after < 2
    assert _good_count(c) == 7  # restored
    c.decide([1.0, 1.0], [0.99, 1.0])
    c.decide([1.0, 1.0], [0.8, 0.8])  # 20 %: back-off to DOP 1
    assert c.dop == 1 and _good_count(c) == 7


def test_adaptive_sample_does_not_shrink_while_the_dop_still_moves():
    c = AdaptiveFromProbe(16)
    d0 = c.dop
    c.decide([1.0] * 4, [1.0] * 4)  # calm, but the DOP grows: the next round is a new DOP
    assert c.dop > d0 and c.share == pytest.approx(0.2)


def test_fixed_sample_is_doppler_twenty_percent_every_round():
    c = FixedFromProbe(2)
    for _ in range(3):
        c.decide([1.0, 1.0], [1.0, 1.0])
        assert _good_count(c) == 7


def test_make_rule_builds_the_platforms_rule_a_chosen_one_or_a_fixed_dop():
    auto = make_rule("auto", 4)
    assert type(auto) is PlatformRule and auto.adapts and auto.dop == 4  # the probe start: 1 + 7, within 4 slots
    published = make_rule("auto", 4, DopplerRule)
    assert type(published) is DopplerRule and published.dop == 1
    fixed = make_rule(3, 4)
    assert isinstance(fixed, FixedDop) and not fixed.adapts and fixed.dop == 3
    assert make_rule(8, 4).dop == 4  # never above the slots
    with pytest.raises(ValueError, match="dop must be 'auto' or a whole number"):
        make_rule("fast", 4)


def test_settings_refuse_numbers_no_rule_can_run_with():
    assert DopplerRule(4).settings == DopSettings()  # the one place the defaults live
    for bad in (dict(sample_share=0), dict(pair_window=0), dict(noise_z=-1), dict(cap=0.5)):
        with pytest.raises(ValueError):
            DopSettings(**bad)


def test_the_runner_limits_a_rules_dop_to_its_slots():
    rule = DopplerRule(64, initial_dop=20)
    rule.limit_max_dop(4)
    assert (rule.max_dop, rule.dop) == (4, 4)
    rule.limit_max_dop(16)  # a limit never raises the bound
    assert rule.max_dop == 4


def test_serial_noise_is_the_mean_of_recent_serial_repeats_and_ignores_failures():
    ctrl = Measured(4, settings=DopSettings(noise_window=3))
    assert ctrl.serial_noise is None and ctrl.allowed_error() == ctrl.settings.error_threshold
    ctrl.record_serial_repeat([1.0, 1.0, None, 2.0], [1.1, 0.8, 1.0, 1e10])  # the last two pairs are failures
    assert ctrl.noise_errors == pytest.approx([0.1, 0.2])
    ctrl.record_serial_repeat([1.0, 1.0], [1.3, 1.0])
    assert ctrl.noise_errors == pytest.approx([0.2, 0.3, 0.0])  # the window keeps the last 3
    assert ctrl.serial_noise == pytest.approx(0.5 / 3)
    # the noise, the threshold, and one standard error of the noise's mean over its 3 pairs
    assert ctrl.allowed_error() == pytest.approx(0.5 / 3 + 0.05 + HALF_NORMAL_SD * (0.5 / 3) / math.sqrt(3))
    ctrl.record_serial_repeat([1.0] * 3, [2.0] * 3)  # a wild host: the excess allowed never passes the limit
    assert ctrl.allowed_error([0.5] * 2) == pytest.approx(1.0 + ctrl.settings.correction_limit)


def test_the_allowed_excess_over_the_noise_narrows_as_the_pairs_add_up():
    # 20 % parallel-vs-serial against 10 % serial noise: from 4 and 4 pairs the 10 % excess is within one
    # standard error of DOPpler's 5 %, from 16 and 16 it is not
    few = Measured(4, initial_dop=2)
    few.record_serial_repeat([1.0] * 4, [1.1] * 4)
    se = HALF_NORMAL_SD * math.sqrt(0.2 ** 2 / 4 + 0.1 ** 2 / 4)
    assert few.allowed_error([0.2] * 4) == pytest.approx(0.1 + 0.05 + se) and 0.1 + 0.05 + se > 0.2
    assert not few.decide([1.0] * 4, [0.8] * 4).backed_off
    assert few.history[-1].allowed_error == pytest.approx(0.1 + 0.05 + se)
    many = Measured(4, initial_dop=2)
    many.record_serial_repeat([1.0] * 16, [1.1] * 16)
    assert many.allowed_error([0.2] * 16) < 0.2 and many.decide([1.0] * 16, [0.8] * 16).backed_off
    # noise_z = 0 is the point rule: the threshold above the mean noise, whatever the sample size
    point = Measured(4, initial_dop=2, settings=DopSettings(noise_z=0))
    point.record_serial_repeat([1.0] * 4, [1.1] * 4)
    assert point.allowed_error([0.2] * 4) == pytest.approx(0.15) and point.decide([1.0] * 4, [0.8] * 4).backed_off
    assert point.would_back_off([1.0, 1.0], [0.8, 0.8]) and not few.would_back_off([1.0, 1.0], [0.9, 0.9])


def test_dopplers_rule_ignores_serial_noise_and_the_platform_default_measures_it():
    plain = DopplerRule(4)
    plain.record_serial_repeat([1.0], [1.5])
    assert plain.serial_noise is None and plain.noise_pairs_wanted() == 0
    assert isinstance(make_rule("auto", 4), MeasuredNoise)
    assert make_rule(2, 4).noise_pairs_wanted() == 0  # a fixed DOP decides nothing


def test_a_round_within_threshold_above_the_noise_keeps_its_dop_and_says_so():
    ctrl = Measured(4, initial_dop=2)
    ctrl.record_serial_repeat([1.0] * 4, [1.1] * 4)  # serial noise 10 %
    dec = ctrl.decide([1.0] * 4, [0.88] * 4)  # 12 % parallel-vs-serial: within 5 % above the noise
    assert not dec.backed_off and ctrl.dop > 2 and dec.serial_noise == pytest.approx(0.1)
    assert ctrl.history[-1].serial_noise == pytest.approx(0.1)
    dec = ctrl.decide([1.0] * 4, [0.7] * 4)  # 30 %: 20 % above the noise, past the threshold + one standard error
    assert dec.backed_off


def test_pooled_noise_pairs_only_while_few_are_known_or_when_the_round_is_contested():
    c = Pooled(2, initial_dop=2)
    assert c.noise_pairs_wanted(probe=True) == 1 and c.noise_pairs_wanted() == 1  # none known yet
    c.record_serial_repeat([1.0, 1.0], [1.01, 0.99])
    assert c.noise_pairs_wanted() == 0  # two known: the standard-error term covers the rest
    assert c.noise_pairs_wanted(contested=True) == 1  # the decision hinges on the noise: one more
    fixed = Measured(2, initial_dop=2)
    fixed.record_serial_repeat([1.0, 1.0], [1.01, 0.99])
    assert fixed.noise_pairs_wanted(probe=True) == 2 and fixed.noise_pairs_wanted() == 1  # every round


def test_a_contested_pair_is_one_past_the_pooled_allowance_or_one_that_would_back_off_alone():
    c = Pooled(2, initial_dop=2)
    c.record_serial_repeat([1.0, 1.0], [1.01, 0.99])  # serial noise 1 %
    c.decide([1.0] * 4, [0.98, 1.01, 0.97, 0.99])  # a calm round at this DOP: its pairs are pooled
    assert c.pairs == pytest.approx([0.02, -0.01, 0.03, 0.01]) and c.dop == 2
    assert not c.contested([1.03], [1.0])  # 3 % off: within what the pool allows
    assert c.contested([1.15], [1.0])  # 13 % off: past the pooled allowance, though not past its own
    assert not c.would_back_off([1.15], [1.0])
    assert c.contested([1.5], [1.0])  # 33 % off: past the correction limit on its own
    fresh = Pooled(2, initial_dop=2)  # nothing pooled yet (a probe): only its own evidence counts
    fresh.record_serial_repeat([1.0, 1.0], [1.01, 0.99])
    assert not fresh.contested([1.15], [1.0])


def test_confirm_wanted_only_when_the_rule_would_back_off_on_the_error():
    ctrl = make_rule("auto", 2)
    assert isinstance(ctrl, ConfirmedBackOff) and ctrl.second_look  # the platform's rule
    ctrl.record_serial_repeat([1.0], [1.02])
    assert not ctrl.confirm_wanted([1.0, 1.0], [0.99, 1.01])  # calm: no second look
    assert ctrl.confirm_wanted([1.0, 1.0], [0.6, 0.6])  # 40 % bias: look again before backing off
    assert ctrl.confirm_wanted([1.0, 1.0], [0.6, 0.6]) == ctrl.would_back_off([1.0, 1.0], [0.6, 0.6])
    assert not ImmediateBackOff(2).confirm_wanted([1.0], [0.5])
    assert not make_rule(2, 2).confirm_wanted([1.0], [0.5])  # a fixed DOP decides nothing


def test_a_runs_dop_rule_is_the_platforms_unless_a_bench_passes_another():
    from tuning.engine.config import TuningConfig

    assert TuningConfig(target="llvm", max_trials=8).dop_rule is None  # the runners make a PlatformRule
    cfg = TuningConfig(target="llvm", max_trials=8, dop_rule=ImmediateBackOff)
    assert type(make_rule(cfg.dop, 2, cfg.dop_rule)) is ImmediateBackOff
    for bad in ("fast", 0, 2.5, True):
        with pytest.raises(ValueError, match="dop must be 'auto' or a whole number"):
            TuningConfig(target="llvm", max_trials=8, dop=bad)


def test_the_probe_times_the_pooled_pairs_and_dopplers_share_without_them():
    assert (make_rule("auto", 2).probe_size(32, 2), ShareProbe(2).probe_size(32, 2)) == (4, 7)
    assert FixedSample(2).probe_size(32, 2) == 7  # pairs only pool when pooled
    assert PlatformRule(8).probe_size(32, 8) == 16  # two per slot at least

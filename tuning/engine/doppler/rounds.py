"""One DOPpler measuring round as a pure function over (jobs, measure, rule).

:func:`measure_round` asks the :class:`~tuning.engine.doppler.rule.DopRule` what to measure at which DOP
and what to re-measure serially, and tells it what was measured; ``measure(jobs, dop)`` does the
measuring (the pooled runner passes its worker pools; a test passes a fake). Nothing here starts a
process, touches TVM or writes into the rule's state.

A round (see ``runner`` for the whole picture):

* the configuration *is* the serial one (DOP 1 at the deployment thread count): measure once;
* a DOP not validated yet (``probe_first``): measure an evenly spread probe in parallel, re-measure
  it serially, and decide before spending the whole round at that DOP;
* else: measure everything in parallel, re-measure the rule's sample and the failures
  serially (a sample the adaptive or pooled rule shrank is timed serially once more, then topped up to
  the full share, when it contests the round's DOP), then correct the rest by the mean error, or, when
  that is too large to correct, re-measure the rest serially but for the candidates that rank after the
  round's median anyway.

Before either kind of round backs off for its error, its sample is timed serially once more when the
rule asks (``DopRule.confirm_wanted``): the round decides on the mean of two serial timings.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from tuning.engine.doppler.plan import RoundDecision
from tuning.engine.doppler.rule import DopRule
from tuning.engine.latency import is_failed_latency
from tuning.engine.measuring.measure import MeasureOutcome

__all__ = [
    "CandidateResult",
    "RoundResult",
    "Measure",
    "measure_round",
    "latency_of",
    "SERIAL_REASONS",
    "serial_totals",
]

# Why a round timed candidates serially: the probe of a DOP not validated yet, DOPpler's sample (outliers,
# rank-spread picks and parallel failures), the noise pairs (a sampled candidate timed serially again),
# the second look of a round about to back off (its sample timed serially again), and the rest of a
# round whose error was past correction_limit.
SERIAL_REASONS = ("probe", "sample", "noise", "confirm", "uncorrectable")

# measure(jobs, dop) -> one (outcome, wall seconds or None) per job, measured DOP at a time
# (dop 1: the serial worker at the deployment thread count)
Measure = Callable[[Sequence[Any], int], Sequence[tuple[MeasureOutcome, float | None]]]


def latency_of(run_secs: Sequence[float] | None) -> float | None:
    """Mean of a measurement's samples; None for no samples or a failure marker."""
    if not run_secs:
        return None
    v = sum(run_secs) / len(run_secs)
    return None if is_failed_latency(v) else v


@dataclasses.dataclass
class CandidateResult:
    """What the round learned about one job."""

    outcome: MeasureOutcome | None = None  # its first measurement
    wall_secs: float | None = None  # wall time of the first measurement (parallel or probe measurements)
    dop: int = 1  # DOP the first measurement ran at
    remeasured: bool = False  # re-measured serially after a parallel measurement
    serial_latency_s: float | None = None  # that serial re-measurement's latency
    serial_repeat_s: float | None = None  # a second serial timing (a noise pair, or a back-off's second look)
    final_secs: list[float] | None = None  # what the runner answers (corrected or serial); None = failed
    final_error: str | None = None

    @property
    def latency_s(self) -> float | None:
        """Latency of the first measurement (None when it failed or did not happen)."""
        o = self.outcome
        return None if (o is None or o.error) else latency_of(o.run_secs)

    @property
    def serial_reference_s(self) -> float | None:
        """What the round judges its parallel timing against: the mean of its serial timings."""
        timed = [x for x in (self.serial_latency_s, self.serial_repeat_s) if x is not None]
        return sum(timed) / len(timed) if timed else None

    @property
    def first_failed(self) -> bool:
        return self.outcome is not None and bool(self.outcome.error)


@dataclasses.dataclass
class RoundResult:
    dop: int  # DOP the round started at
    decision: RoundDecision
    candidates: list[CandidateResult]
    correction_applied: bool
    validated: set[int]  # DOPs validated (by a probe or a good round) after this round
    warm_dop: int | None = None  # the next round's parallel configuration, to start now
    parallel_wall_s: float = 0.0  # wall time of the round's measure calls at its DOP (DOP 1 rounds: all)
    serial_wall_s: float = 0.0  # wall time of its serial re-measures (sample, failures, noise repeats)
    # of serial_wall_s, by why they were timed serially (SERIAL_REASONS): {reason: {"n": timings, "secs": wall,
    # "failed": of those, candidates re-timed after failing in parallel (when any)}}
    serial_by_reason: dict[str, dict] = dataclasses.field(default_factory=dict)

    @property
    def n_remeasured(self) -> int:
        return sum(1 for c in self.candidates if c.remeasured)

    @property
    def n_failures(self) -> int:
        return sum(1 for c in self.candidates if not c.final_secs)


class _Round:
    """The candidates of one round and the two ways to measure them."""

    def __init__(self, jobs: Sequence[Any], measure: Measure) -> None:
        self.jobs = list(jobs)
        self.measure = measure
        self.results = [CandidateResult() for _ in self.jobs]
        self.correction_applied = False
        self.parallel_wall_s = 0.0
        self.serial_wall_s = 0.0
        self.serial_by_reason: dict[str, dict] = {}
        self.outliers_skipped = 0  # slow candidates left as measured (DopRule.rankable_bound)
        self.sample_topped_up = 0  # candidates a shrunk sample was topped up with (DopRule.top_up_sample)

    def _timed(
        self, idx: Sequence[int], dop: int, *, serial: str | None
    ) -> Sequence[tuple[MeasureOutcome, float | None]]:
        """``serial``: why these are re-measured serially (one of SERIAL_REASONS), None for first timings."""
        t0 = time.perf_counter()
        outs = self.measure([self.jobs[i] for i in idx], dop)
        wall = time.perf_counter() - t0
        if serial:
            self.serial_wall_s += wall
            row = self.serial_by_reason.setdefault(serial, {"n": 0, "secs": 0.0})
            row["n"] += len(idx)
            row["secs"] += wall
            failed = sum(1 for i in idx if self.results[i].first_failed)  # re-timed after failing in parallel
            if failed:
                row["failed"] = row.get("failed", 0) + failed
        else:
            self.parallel_wall_s += wall
        return outs

    def parallel(self, idx: Sequence[int], dop: int) -> None:
        for i, (out, wall) in zip(idx, self._timed(idx, dop, serial=None)):
            c = self.results[i]
            c.dop, c.outcome, c.wall_secs = dop, out, wall
            c.final_secs = out.run_secs if not out.error else None
            c.final_error = out.error

    def serial(self, idx: Sequence[int], *, count_as_remeasure: bool, reason: str = "sample") -> None:
        """Measure serially: a re-measure (``count_as_remeasure``, for ``reason``) or the only measurement
        of these candidates (the rest of a round a probe sent back to DOP 1), timed as parallel work then."""
        for i, (out, _) in zip(idx, self._timed(idx, 1, serial=reason if count_as_remeasure else None)):
            c = self.results[i]
            if c.outcome is None:  # first and only measurement of this candidate
                c.outcome = out
            else:
                c.remeasured = count_as_remeasure
                c.serial_latency_s = None if out.error else latency_of(out.run_secs)
            c.final_secs = out.run_secs if not out.error else None
            c.final_error = out.error

    def serial_repeat(self, idx: Sequence[int], rule: DopRule, reason: str = "noise") -> None:
        """Time candidates timed serially once (not twice) once more, serially: the pair tells the
        rule the host's serial noise; the candidate keeps both timings' samples, and their mean
        is its serial reference."""
        idx = [
            i
            for i in idx
            if self.results[i].serial_latency_s is not None
            and self.results[i].final_secs
            and self.results[i].serial_repeat_s is None
        ]
        if not idx:
            return
        outs = self._timed(idx, 1, serial=reason)
        seconds = [None if out.error else latency_of(out.run_secs) for out, _ in outs]
        rule.record_serial_repeat([self.results[i].serial_latency_s for i in idx], seconds)
        for i, (out, _), sec in zip(idx, outs, seconds):
            c = self.results[i]
            if sec is not None:
                assert c.final_secs is not None  # idx kept only candidates with final timings; _timed keeps them
                c.serial_repeat_s = sec
                c.final_secs = list(c.final_secs) + list(out.run_secs)

    def references(self, idx: Sequence[int]) -> list[float | None]:
        return [self.results[i].serial_reference_s for i in idx]

    def confirmed_references(
        self, idx: Sequence[int], parallel: Sequence[float | None], rule: DopRule
    ) -> list[float | None]:
        """The serial references of the sampled ``idx`` (parallel timings ``parallel``), after a second
        serial timing of each when the rule is about to back off on them (confirm_wanted)."""
        refs = self.references(idx)
        if rule.confirm_wanted(parallel, refs):
            self.serial_repeat(idx, rule, reason="confirm")
            refs = self.references(idx)
        return refs

    def fastest_serial(self, idx: Sequence[int], k: int) -> list[int]:
        """The ``k`` candidates of ``idx`` with the fastest serial timings (the ones ranking matters most for)."""
        timed = [(i, secs) for i in idx if (secs := self.results[i].serial_latency_s) is not None]
        return [i for i, _ in sorted(timed, key=lambda pair: pair[1])][: max(0, k)]

    def latencies(self, idx: Sequence[int]) -> list[float | None]:
        return [self.results[i].latency_s for i in idx]

    def failures_due_to_parallelism(self, failed: Sequence[int]) -> int:
        """Failed in parallel, fine serially."""
        return sum(1 for i in failed if self.results[i].final_error is None)

    def correct(self, idx: Sequence[int], rule: DopRule, err: float | None) -> None:
        """``idx``: candidates with final timings (both callers keep only those)."""
        for i in idx:
            secs = self.results[i].final_secs
            assert secs is not None, "only candidates with final timings are corrected"
            self.results[i].final_secs = rule.correct(secs, err)
            self.correction_applied = True


def _probe_then_rest(
    rnd: _Round, rule: DopRule, dop: int, probe: list[int], validated: set[int], is_serial_config: Callable[[int], bool]
) -> RoundDecision:
    """A DOP not validated yet: decide on a probe, then measure the rest accordingly."""
    n = len(rnd.jobs)
    rnd.parallel(probe, dop)
    plat = rnd.latencies(probe)
    failed = [i for i in probe if rnd.results[i].first_failed]
    rnd.serial(probe, count_as_remeasure=True, reason="probe")
    rnd.serial_repeat(rnd.fastest_serial(probe, rule.noise_pairs_wanted(probe=True)), rule)
    decision = rule.decide(plat, rnd.confirmed_references(probe, plat, rule), rnd.failures_due_to_parallelism(failed))
    in_probe = set(probe)
    rest = [i for i in range(n) if i not in in_probe]
    if decision.backed_off or not rule.can_correct(decision.mean_signed_error):
        smaller = max(1, min(decision.dop_after, n))
        if is_serial_config(smaller):
            rnd.serial(rest, count_as_remeasure=False)
        else:  # backed off to a smaller, still parallel DOP: re-validate next round
            rnd.parallel(rest, smaller)
        return decision
    validated.add(dop)
    rnd.parallel(rest, dop)
    keep, skip = rule.split_outliers(rnd.latencies(rest), dop)
    outliers = [rest[k] for k in keep]
    rnd.outliers_skipped += len(skip)
    rest_failed = [i for i in rest if rnd.results[i].first_failed]
    rnd.serial(sorted(set(outliers) | set(rest_failed)), count_as_remeasure=True, reason="sample")
    rnd.correct(
        [i for i in rest if not rnd.results[i].remeasured and rnd.results[i].final_secs],
        rule,
        decision.mean_signed_error,
    )
    return decision


def _sampled_round(
    rnd: _Round, rule: DopRule, dop: int, validated: set[int], remeasure_on_large_error: bool
) -> RoundDecision:
    """Everything in parallel; the rule's sample and the failures serially; the rest corrected."""
    n = len(rnd.jobs)
    rnd.parallel(list(range(n)), dop)
    lat = rnd.latencies(range(n))
    sample, skipped = rule.serial_sample(lat, dop)
    rnd.outliers_skipped += len(skipped)
    failed = [i for i in range(n) if rnd.results[i].first_failed]
    rnd.serial(sorted(set(sample) | set(failed)), count_as_remeasure=True)
    extra = rule.top_up_sample(lat, sample, rnd.references(sample))
    if extra and rule.second_look:
        # a second serial timing of the shrunk sample is one timing a candidate where a top-up is several:
        # a single glitched serial timing no longer buys the whole share
        rnd.serial_repeat(sample, rule, reason="confirm")
        extra = rule.top_up_sample(lat, sample, rnd.references(sample))
    if extra:  # a shrunk sample showed an uncorrectable error: decide on the full share first
        rnd.serial(extra, count_as_remeasure=True)
        rnd.sample_topped_up += len(extra)
        sample = sorted(set(sample) | set(extra))
    sampled_parallel = [lat[i] for i in sample]
    contested = rule.contested(sampled_parallel, rnd.references(sample))
    rnd.serial_repeat(rnd.fastest_serial(sample, rule.noise_pairs_wanted(contested=contested)), rule)
    decision = rule.decide(
        sampled_parallel,
        rnd.confirmed_references(sample, sampled_parallel, rule),
        rnd.failures_due_to_parallelism(failed),
    )
    if not decision.backed_off:
        validated.add(dop)
    rest = [i for i in range(n) if not rnd.results[i].remeasured and rnd.results[i].final_secs]
    err = decision.mean_signed_error
    if rest and rule.can_correct(err):
        rnd.correct(rest, rule, err)
    elif rest and err is not None and remeasure_on_large_error:
        # past correction: time the rest serially, but for the candidates that rank after the round's
        # median whatever their serial timing (DopRule.rankable_bound), left as measured
        bound = rule.rankable_bound(lat, dop, err)
        rankable = [i for i in rest if bound is None or (parallel_s := lat[i]) is None or parallel_s <= bound]
        rnd.outliers_skipped += len(set(rest) - set(rankable) - set(skipped))  # the sample's were counted
        rnd.serial(rankable, count_as_remeasure=True, reason="uncorrectable")
    return decision


def serial_totals(reports) -> dict[str, dict]:
    """Rounds' serial timings summed by reason: {reason: {"n": timings, "secs": wall, "failed": n}}, from
    objects carrying ``serial_by_reason`` (RoundResult, the runner's RoundReport)."""
    out: dict[str, dict] = {}
    for r in reports:
        for reason, row in (getattr(r, "serial_by_reason", None) or {}).items():
            tot = out.setdefault(reason, {"n": 0, "secs": 0.0})
            for k, v in row.items():
                tot[k] = tot.get(k, 0) + v
    return out


def measure_round(
    jobs: Sequence[Any],
    measure: Measure,
    rule: DopRule,
    *,
    is_serial_config: Callable[[int], bool],
    validated: set[int] | frozenset[int] = frozenset(),
    probe_first: bool = True,
    remeasure_on_large_error: bool = True,
) -> RoundResult:
    """Measure ``jobs`` as one DOPpler round (module doc). ``is_serial_config(dop)``: whether that
    DOP's worker layout is the serial one; ``validated``: DOPs already validated (not changed: the
    result carries the new set). The rule decides one round (its DOP, cap and history advance)."""
    n = len(jobs)
    plan = rule.plan_round(n, validated=validated, probe_first=probe_first)
    dop = plan.dop
    rnd = _Round(jobs, measure)
    validated = set(validated)
    warm_dop = None
    if is_serial_config(dop):
        rnd.parallel(list(range(n)), dop)
        decision = rule.decide_serial_round()
    else:
        if plan.probe:
            decision = _probe_then_rest(rnd, rule, dop, list(plan.probe), validated, is_serial_config)
        else:
            decision = _sampled_round(rnd, rule, dop, validated, remeasure_on_large_error)
        if decision.backed_off:
            validated.discard(dop)
        if decision.dop_after != dop:
            warm_dop = decision.dop_after
        rule.note_round(outliers_skipped=rnd.outliers_skipped, sample_topped_up=rnd.sample_topped_up)
    return RoundResult(
        dop=dop,
        decision=decision,
        candidates=rnd.results,
        correction_applied=rnd.correction_applied,
        validated=validated,
        warm_dop=warm_dop,
        parallel_wall_s=rnd.parallel_wall_s,
        serial_wall_s=rnd.serial_wall_s,
        serial_by_reason=rnd.serial_by_reason,
    )

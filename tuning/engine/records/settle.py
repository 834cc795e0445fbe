"""What a verified record-cache seed does to a run: settled, or searched on from its seed.

A verified task (:func:`tuning.engine.records.seeds.verify_seeds`) is *settled* (no further tuning,
its trials go to the other tasks through the run's share allocation) only when its record is a
converged result (:func:`convergence`: the source's search had plateaued or run out, or two source
runs agree); otherwise the task is searched on from its seeds, judged by the plateau rule from the
seed's time once it has had its share of this run's budget
(:func:`~tuning.engine.budget.fair_shares`).

:func:`seed_decisions` reads (or makes) the run's verdicts and says which tasks are settled, searched
and seeded; :func:`apply_seed_decisions` tells the run's :class:`~tuning.engine.budget.TrialBudget`.
The session wires the two (it owns the run's budget).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from tuning.engine.budget import TrialBudget, fair_shares
from tuning.engine.records.seeds import (
    VERIFY_FILE,
    load_manifest,
    load_verification,
    verify_seeds,
)

__all__ = ["convergence", "settle_decisions", "SeedDecisions", "seed_decisions", "apply_seed_decisions"]


def convergence(want: dict, share: int) -> tuple[bool, str]:
    """Whether a task's cached record is a converged result, one this run could not expect to beat by
    searching, and why. A verified time says nothing of that: a source run that spent a few trials
    leaves a poor record that verifies all the same. Converged: the source's search had plateaued
    (Trimmer's rule, or the plateau rule of a cache-seeded search) or ran out of candidates, or two
    independent runs agree on the best. The trials the source spent are no proof: measured
    (bench/record_cache.py --quick), records from a source that spent 16 trials on a task, more than
    this run's latency share of it (``share``, :func:`~tuning.engine.budget.fair_shares`) and what a
    cold run gives it, settled the task at a coin flip against a cold run's own 16 trials, and three
    such tasks left the warm model 4 % slower than cold. Entries that do not say how far they were
    tuned (published before that was recorded) are not converged."""
    trials = want.get("source_trials")
    spent = "an unknown number of" if trials is None else str(int(trials))
    if want.get("source_converged"):
        return True, f"converged: the source run's search had plateaued or run out (after {spent} trials)"
    if int(want.get("agreeing_runs") or 0) >= 2:
        return True, f"converged: {want['agreeing_runs']} source runs agree on the best"
    return False, (
        f"not converged (the source spent {spent} trials and had not plateaued; this run's share "
        f"is {int(share)}): searched on from its seeds"
    )


def settle_decisions(result: dict, manifest: dict, infos, max_trials: int) -> dict:
    """Add to each verdict of ``result`` whether its task is settled (verified and converged: no further
    trials) and its ``share_trials``, ``converged`` and ``convergence`` reason (:func:`convergence`)."""
    shares = fair_shares(infos, {int(v["task_index"]): v["measured_best_s"] for v in result["tasks"]}, max_trials)
    for v in result["tasks"]:
        want = manifest.get("tasks", {}).get(str(v["task_index"])) or {}
        share = shares.get(int(v["task_index"]), 0)
        converged, why = convergence(want, share)
        v.update(
            share_trials=share,
            source_trials=want.get("source_trials"),
            converged=converged,
            convergence=why,
            settled=bool(v["verified"] and converged),
        )
        if v["verified"]:
            v["reason"] = f"verified; {why}"
    return result


@dataclasses.dataclass
class SeedDecisions:
    """What the record cache's verified seeds do to a run's budget."""

    settled: dict[int, int]  # task -> seeds measured: verified and converged, no further trials
    searched: dict[int, int]  # task -> trials before the plateau rule may park it: verified, not converged
    seeded: dict[int, tuple[float | None, int]]  # every seeded task -> (best seed time here, trials it took)

    @property
    def needs_budget(self) -> bool:
        """Whether a run without Trimmer needs a budget for them (seed times alone change nothing there)."""
        return bool(self.settled or self.searched)


def seed_decisions(
    work_dir: str, tasks, database, infos, max_trials: int, *, resumed: bool, retime=None
) -> SeedDecisions | None:
    """After the imported seeds were measured: verify the cache's seeds (once; a resumed run reads the
    verdicts back; ``retime``: see :func:`~tuning.engine.records.seeds.verify_seeds`), and decide which
    verified tasks are settled (:func:`settle_decisions`) and which are searched on from their seeds.
    None when the run was not seeded."""
    result = load_verification(work_dir) or verify_seeds(work_dir, tasks, database, retime)
    if not result:
        return None
    if any("settled" not in v for v in result["tasks"]):
        result = settle_decisions(result, load_manifest(work_dir) or {}, infos, int(max_trials))
        Path(os.path.join(work_dir, VERIFY_FILE)).write_text(json.dumps(result))
    verdicts = result["tasks"]
    # a resumed run's budget already counted the seeds from its database
    return SeedDecisions(
        settled={v["task_index"]: v["n_seeds"] for v in verdicts if v["settled"]},
        searched={v["task_index"]: v["share_trials"] for v in verdicts if v["verified"] and not v["settled"]},
        seeded={
            v["task_index"]: (v["measured_best_s"], 0 if resumed else int(v["n_seeds"]) + int(v.get("n_retimed", 0)))
            for v in verdicts
        },
    )


def apply_seed_decisions(budget: TrialBudget, decisions: SeedDecisions) -> None:
    """Tell the run's budget: every seed's time and trials are learned as a batch's are (so the freed
    trials are shared by the tasks' real latency shares from the first round, and a seeded task's search
    is judged against the seed it started from); settled tasks are done from the start (never resumed:
    when every task is settled the run ends, its budget saved), and not reported as Trimmer's
    pre-emptions; searched tasks may be parked by the plateau rule once they have had their share."""
    with budget.lock:
        for i, (best, n) in decisions.seeded.items():
            budget.learn_seed(i, best, n)
        for i, n in decisions.settled.items():
            budget.settle(i, n)
        for i, floor in decisions.searched.items():
            budget.judge_after(i, floor)

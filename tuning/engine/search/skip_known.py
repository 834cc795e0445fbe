"""Never measure a candidate the run's TVM database (or its journal) already holds.

TVM's evolutionary search remembers what *it* picked (in memory), not what the database holds: a call
that resumes a run (its executor was killed, the run was paused) proposes the traces an earlier call
measured again, TVM commits each of them a second time, and a task whose design space is one schedule
(a reshape) is measured once per call. :class:`SkipKnownSearch` wraps a task's search strategy and
drops every proposed candidate whose key (``events.candidate_key``) the run knows: the records of TVM's
database and of the streamed journal at the start of the call (``session._prepare`` commits the journal
first) plus what this call has measured since (``EngineState.known_keys``). Dropped candidates are
never built, measured nor counted: the budget counts stored records only. The call's budget is a hard
cap too (:class:`CallBudget`): TVM checks its global budget before it asks a task for a batch, so the
last batch of a call could overshoot it by up to a round; here it is cut to what is left.

When the search has nothing new left (it proposes nothing, or only known traces until it stops
proposing), the task is done: it is marked exhausted and the search returns None, which makes TVM
terminate the task instead of asking again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.search_strategy import PySearchStrategy

from tuning.engine.events import candidate_key

__all__ = ["CallBudget", "SkipKnownSearch", "new_candidates", "MAX_ASKS"]

log = logging.getLogger(__name__)

# how many batches of only-known traces a search may propose before the task is left for this call;
# each ask adds the proposed traces to the search's own memory, so a search with more to offer moves on
MAX_ASKS = 8


def new_candidates(candidates: Sequence, keys: Sequence[str], known: set[str]) -> list:
    """The candidates whose key is not in ``known`` (and not repeated within the batch), in order."""
    seen: set[str] = set()
    out = []
    for cand, key in zip(candidates, keys):
        if key in known or key in seen:
            continue
        seen.add(key)
        out.append(cand)
    return out


class CallBudget:
    """The trials one call may still send to the builder, shared by its tasks' searches."""

    def __init__(self, trials: int) -> None:
        self.left = max(0, int(trials))
        self._lock = threading.Lock()

    def take(self, wanted: int) -> int:
        """How many of ``wanted`` candidates may be sent (taken from what is left)."""
        with self._lock:
            n = min(self.left, max(0, int(wanted)))
            self.left -= n
            return n


@derived_object
class SkipKnownSearch(PySearchStrategy):
    """A task's search strategy (``inner``: TVM's EvolutionarySearch or Trimmer's FilteredSearch) that
    proposes only candidates the run has not measured. ``state`` is the run's ``EngineState`` (its
    ``known_keys`` under its ``lock``, its ``exhausted`` tasks and Trimmer)."""

    def __init__(
        self,
        inner,
        *,
        task_index: int,
        task_name: str,
        state,
        budget: CallBudget | None = None,
        key: Callable | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.budget = budget
        self.task_index = int(task_index)
        self.task_name = task_name
        self.state = state
        self.key = key or candidate_key
        self.n_skipped = 0  # known candidates the search proposed and this wrapper dropped

    def _initialize_with_tune_context(self, context) -> None:
        self.inner._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None) -> None:
        self.inner.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database, cost_model)

    def post_tuning(self) -> None:
        self.inner.post_tuning()

    def generate_measure_candidates(self):
        if self.budget is not None and self.budget.left <= 0:
            return None  # the call's budget is spent: TVM ends the task for this call
        skipped = False
        for _ in range(MAX_ASKS):
            cands = self.inner.generate_measure_candidates()
            # an empty batch is TVM's "nothing new"; None right after known traces were dropped is the
            # search failing to find anything else (its own budget counts measured candidates only)
            if cands is None or len(cands) == 0:
                if cands is not None or skipped:
                    self._exhausted()
                return None
            cands = list(cands)
            keys = [self.key(self.task_name, c.sch.trace) for c in cands]
            with self.state.lock:
                fresh = new_candidates(cands, keys, self.state.known_keys)
            self.n_skipped += len(cands) - len(fresh)
            pacer = getattr(self.state, "pacer", None)
            if fresh and pacer is not None:  # a task's first batch, sized so the time budget reaches every task
                fresh = fresh[: pacer.first_batch(self.task_index, len(fresh))]
            if fresh and self.budget is not None:
                fresh = fresh[: self.budget.take(len(fresh))]
            self._note_not_sent(len(cands) - len(fresh))
            if fresh:
                return fresh
            if self.budget is not None and self.budget.left <= 0:
                return None
            skipped = True
        log.info(
            "task %d (%s): the search proposed only measured candidates %d times; left for this call",
            self.task_index,
            self.task_name,
            MAX_ASKS,
        )
        return None

    def _note_not_sent(self, n: int) -> None:
        """Trimmer's filter counted the batch it just kept as sent: tell the run's Trimmer how many of those
        this wrapper dropped, so its counts add up to what is measured (without the filter it noted no
        batch, and there is nothing to amend)."""
        if n > 0 and self.state.trimmer is not None:
            self.state.trimmer.note_not_sent(self.task_index, n)

    def _exhausted(self) -> None:
        """Nothing new to measure: the task is done (Trimmer hears it as a round without improvement)."""
        st = self.state
        with st.lock:
            if self.task_index in st.exhausted:
                return
            st.exhausted.add(self.task_index)
        if st.trimmer is not None:
            try:
                st.trimmer.observe_batch(self.task_index, [], round_index=-1, exhausted=True)
            except Exception as exc:  # noqa: BLE001 - Trimmer must never stop the search
                st.sink_errors.append(f"trimmer: {exc!r}")

    def notify_runner_results(self, measure_candidates, results) -> None:
        self.inner.notify_runner_results(measure_candidates, results)

    def clone(self):
        return SkipKnownSearch(
            self.inner.clone(),
            task_index=self.task_index,
            task_name=self.task_name,
            state=self.state,
            budget=self.budget,
            key=self.key,
        )

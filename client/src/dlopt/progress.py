"""A run's progress on the terminal: drawn again only when what it shows changed.

On a TTY one line is redrawn in place (`\\r`); elsewhere (a CI log, a pipe) each change is one plain
line, so a log holds one line per change and none per poll.
"""
from __future__ import annotations

from typing import Any, TextIO


def _latency(seconds: Any) -> str:
    return f"{seconds * 1e3:.3f} ms" if isinstance(seconds, (int, float)) and seconds else "-"


class RunProgress:
    def __init__(self, stream: TextIO, *, tty: bool | None = None, width: int = 30) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.width = width
        self.draws = 0
        self._shown: tuple[Any, ...] | None = None
        self._line_length = 0

    @staticmethod
    def state_of(run: dict[str, Any]) -> tuple[Any, ...]:
        """What the bar shows; a poll that finds the same tuple draws nothing."""
        status = run.get("status", "")
        if run.get("requested_action") and status == "running":
            status = f"{run['requested_action']} requested"
        return (run.get("id"), min(run.get("trials_done") or 0, run.get("max_trials") or 0),
                run.get("max_trials") or 0, status, _latency(run.get("estimated_latency_s")))

    def update(self, run: dict[str, Any]) -> bool:
        """Show the run; True when something was drawn."""
        state = self.state_of(run)
        if state == self._shown:
            return False
        self._shown = state
        run_id, done, total, status, estimate = state
        share = done / total if total else 0.0
        if self.tty:
            filled = round(share * self.width)
            line = (f"run {run_id} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} trials "
                    f"{share:4.0%}  {status}  est. {estimate}")
            self.stream.write("\r" + line.ljust(self._line_length))
            self._line_length = len(line)
        else:
            self.stream.write(f"run {run_id}: {done}/{total} trials ({share:.0%}), {status}, est. {estimate}\n")
        self.stream.flush()
        self.draws += 1
        return True

    def close(self) -> None:
        if self.tty and self.draws:
            self.stream.write("\n")
            self.stream.flush()

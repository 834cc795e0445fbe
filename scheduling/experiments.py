"""Re-export of :mod:`scheduling.horus.experiments`, where the one path from a trace to a result now
lives (Django-free). Kept so the command, the API serializer and the services keep importing; new code
imports ``scheduling.horus.experiments`` (engine) or goes through ``scheduling.adapters``."""
from __future__ import annotations

from .horus.experiments import (  # noqa: F401
    METHODS,
    POLICY_NAMES,
    SHIPPED_TRACES,
    ExperimentError,
    ExperimentParams,
    build_cluster,
    format_table,
    load_jobs,
    run_experiment,
    simulation_size,
    summary_table,
)

__all__ = ["ExperimentParams", "ExperimentError", "SHIPPED_TRACES", "METHODS", "POLICY_NAMES", "load_jobs",
           "build_cluster", "simulation_size", "run_experiment", "summary_table", "format_table"]

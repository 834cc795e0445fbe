"""Horus (IEEE TPDS 2022) for the platform: predict a DL job's GPU utilization
and memory from its computation graph, place jobs on shared GPUs by a score
that penalises predicted over-subscription, and evaluate placement policies on
public cluster traces. Plain Python (numpy, XGBoost); no Django here.

Modules:

* :mod:`.features` - feature vectors (``feature_vector``) and the cached zoo
  feature table (``zoo_feature_table``); extraction itself is
  ``core.onnx_models.features.compute_features``.
* :mod:`.profiles` - GPU profile records, load/save, the synthetic seed set.
* :mod:`.predictor` - ``UtilizationPredictor().train(records) -> TrainedPredictor``.
* :mod:`.cluster` - cluster spec/state and the read-only ``ClusterView``.
* :mod:`.policies` - ``PlacementPolicy`` (``place``, ``score``, ``rebalance``) and
  ``POLICIES`` (Horus and baselines).
* :mod:`.usage_fgd` - ``usage_fgd``, our policy: FGD on predicted usage, overcommitting
  under a bound on fitted interference.
* :mod:`.traces` - Alibaba-2023 / Philly parsers, workload assignment.
* :mod:`.simulator` - ``simulate`` (replay) and ``simulate_fill`` (ATC'23 fill), the
  entry points over :mod:`.replay` (event queue, state machine, accounting,
  summary; the pluggable ``InterferenceModel``) and :mod:`.fill`.
* :mod:`.interference` - the default interference model, ``FittedInterference``:
  work-conserving, fitted per GPU type to Gavel's measured co-location pairs
  (``data/interference/``); the fit and its held-out evaluation.
* :mod:`.experiments` - ``run_experiment``: the one path from a trace to a result
  (bench, ``manage.py simulate``, dashboard).
"""

from .cluster import ClusterSpec, ClusterState, ClusterView, JobView, NodeSpec, PlacementError
from .features import FEATURE_COLUMNS, feature_vector, zoo_feature_table
from .policies import POLICIES, PlacementPolicy, horus_score, make_policy
from .predictor import TrainedPredictor, UtilizationPredictor
from .profiles import ProfileRecord, ProfileTable, load_profiles, save_profiles
from .simulator import (
    FillResult,
    FittedInterference,
    Interference,
    InterferenceModel,
    SharingPenalty,
    SimulationResult,
    simulate,
    simulate_fill,
)
from .usage_fgd import UsageFGD
from .traces import (
    Job,
    TraceFormatError,
    assign_workloads,
    load_alibaba_nodes,
    load_alibaba_pods,
    load_philly,
    parse_trace,
)

POLICIES[UsageFGD.name] = UsageFGD  # our policy, registered beside the paper's (see usage_fgd)

__all__ = [
    "ClusterSpec",
    "ClusterState",
    "ClusterView",
    "JobView",
    "NodeSpec",
    "PlacementError",
    "FEATURE_COLUMNS",
    "feature_vector",
    "zoo_feature_table",
    "POLICIES",
    "PlacementPolicy",
    "horus_score",
    "make_policy",
    "UsageFGD",
    "TrainedPredictor",
    "UtilizationPredictor",
    "ProfileRecord",
    "ProfileTable",
    "load_profiles",
    "save_profiles",
    "FillResult",
    "FittedInterference",
    "Interference",
    "InterferenceModel",
    "SharingPenalty",
    "SimulationResult",
    "simulate",
    "simulate_fill",
    "Job",
    "TraceFormatError",
    "assign_workloads",
    "load_alibaba_nodes",
    "load_alibaba_pods",
    "load_philly",
    "parse_trace",
]

"""The tuning engine: TVM 0.27 MetaSchedule plug-ins, no Django, no Celery.

Modules (import them directly; nothing heavy is imported here):

- ``relax_pipeline``: ONNX -> Relax, the pre-tuning passes, task extraction,
  compile (tuned/untuned), end-to-end timing.
- ``session``: ``TuningConfig``, ``run_tuning`` (stock or DOPpler mode,
  resumable, cancel/pause through the sink), ``compile_and_compare``; cheap to
  import (TVM's compiler is imported when a run starts).
- ``workloads`` / ``database``: the tasks of a model; the run's files in its
  ``work_dir`` (TVM's JSONDatabase, ``final/``, imported seeds, resume state).
- ``plugins``: the plug points, ``make_builder(kind)`` / ``make_runner(kind)``
  (a registry, like TVM's ``Builder.create`` / ``Runner.create``).
- ``search`` / ``remeasure``: the run's steps that need TVM (the MetaSchedule
  search; imported seeds and DOPpler's final serial re-measure).
- ``builder``: ``PersistentBuilder`` (long-lived Popen workers, ``.so``).
- ``runner``: ``PooledAsyncRunner`` (core-partitioned pool, DOP control) and
  ``DistributedRunner`` (injected ``submit`` -> per-device measure queues).
- ``doppler`` / ``rounds``: ``DOPController`` (pure DOPpler rule) and one
  measuring round as a pure function over (jobs, measure, controller).
- ``measure`` / ``timer``: the pure measuring function a remote worker runs
  with only TVM's runtime, and the per-device timer.
- ``callbacks`` / ``scheduler`` / ``events``: streaming to a ``TuningSink``.
- ``trimmer`` (pure rules) / ``trimmer_hooks`` (``TrimmerRuntime``,
  ``FilteredSearch``): Trimmer's pre-emption, whole-model stop and candidate
  filter, on with ``TuningConfig(trimmer=...)``.
- ``energy``: RAPL / NVML / modeled meters, each reading labeled.
- ``isolate`` / ``sandbox`` / ``procpool``: child processes for TVM calls on
  user input, their environment and limits, persistent worker pools.
- ``yardstick`` / ``verdict``: onnxruntime timed like the tuned module; the one
  rule that turns both engines' repeat samples and the host load into a verdict.
- ``package`` / ``package_run``: a run's deployment zip (module, manifest) and
  the ``run.py`` shipped in it (numpy + TVM runtime only).
"""

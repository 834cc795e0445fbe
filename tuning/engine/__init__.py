"""The tuning engine: TVM 0.27 MetaSchedule plug-ins, no Django, no Celery.

One folder per mechanism (import modules directly; nothing heavy is imported here):

- ``compile/``: ONNX -> Relax (``pipeline``), the graph passes (``passes``), task
  extraction (``workloads``), targets and their closed schema, TVM workarounds.
- ``doppler/``: DOPpler's degree-of-parallelism rules (``rule``, ``doppler_rule``, ``platform_rule``), one measuring
  round as a pure function (``rounds``), the parallel-vs-serial error.
- ``trimmer/``: Trimmer's pure rules (``rules``), its runtime in a run (``hooks``), the
  candidate filter (``filter``), its latency predictor.
- ``records/``: the import check of a TVM database (``check``, ``check_replay``), the
  record cache's engine side (``cache_key``, ``seeds``, ``settle``, ``publish``,
  ``exchange``), the cost model's data-only file format.
- ``search/``: MetaSchedule's evolutionary search (``loop``), the task scheduler with
  a stop switch, the state they share (``engine_state``), the callbacks that stream
  measurements to a ``TuningSink``.
- ``runners/``: the pooled and distributed measuring runners, the persistent builder,
  the plug-point registry (``plugins.make_builder`` / ``make_runner``).
- ``measuring/``: the pure measuring function a remote worker runs with TVM's runtime
  only, per-device timers, CPU and GPU measurement slots.
- ``process/``: persistent worker pools, one-shot isolated calls, the sandbox, and the
  lifeline that ends the engine with its starter.
- ``deploy/``: a run's deployment package and the ``run.py`` shipped in it.

Top level: ``session`` (``TuningConfig``, ``run_tuning``, ``compile_and_compare``; cheap
to import), ``workdir`` (a run's files: TVM's JSONDatabase, ``final/``, resume state),
``events`` (what the engine reports), ``remeasure`` (measurements outside the search),
``energy`` (labelled meters), ``yardstick`` (onnxruntime timed the same way),
``verdict`` (the one deployment-verdict rule), ``testing`` (small workloads), ``budget``
(a run's trials per task and their share allocation: Trimmer and the record cache both use it).
"""

"""The tuning engine: TVM 0.27 MetaSchedule plug-ins, no Django, no Celery.

Modules (import them directly; nothing heavy is imported here):

- ``relax_pipeline``: ONNX -> Relax, the pre-tuning passes, task extraction,
  compile (tuned/untuned), end-to-end timing.
- ``session``: ``TuningConfig``, ``run_tuning`` (stock or DOPpler mode,
  resumable, cancel/pause through the sink), ``compile_and_compare``.
- ``builder``: ``PersistentBuilder`` (long-lived Popen workers, ``.so``).
- ``runner``: ``PooledAsyncRunner`` (core-partitioned pool, DOP control) and
  ``DistributedRunner`` (injected ``submit`` -> per-device measure queues).
- ``doppler``: ``DOPController`` (pure DOPpler rule).
- ``measure`` / ``timer``: the pure measuring function a remote worker runs
  with only TVM's runtime, and the per-device timer.
- ``callbacks`` / ``scheduler`` / ``events``: streaming to a ``TuningSink``.
- ``trimmer`` (pure rules) / ``trimmer_hooks`` (``TrimmerRuntime``,
  ``FilteredSearch``): Trimmer's pre-emption, whole-model stop and candidate
  filter, on with ``TuningConfig(trimmer=...)``.
- ``energy``: RAPL / NVML / modeled meters, each reading labeled.
"""

"""GPU scheduling: nodes, GPUs and their NVML telemetry, GPU jobs placed by Horus (or a
baseline policy) and routed to their GPU's Celery queue, profiles, predictor versions,
trace uploads and trace-driven simulations. Algorithms: ``scheduling.horus`` (no Django).
"""

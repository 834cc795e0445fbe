"""Trimmer: pure cost-cutting rules, their hooks into a run, and Trimmer's own latency predictor."""

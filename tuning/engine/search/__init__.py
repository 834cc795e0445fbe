"""The search step: MetaSchedule's evolutionary search, the task scheduler with a stop switch, streaming callbacks."""

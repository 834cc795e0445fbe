"""The platform-wide tuning-record cache: trusted serial measurements of every successful run, looked up
by every run's tasks (see tuning/engine/records/ for the engine side)."""

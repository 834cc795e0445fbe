"""The deployment package of a run and the run.py shipped in it."""

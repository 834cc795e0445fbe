"""Functions the measuring-hygiene tests run inside worker processes."""

import subprocess
import time


def hang(*args, **kwargs):
    """A measurement that never ends."""
    time.sleep(3600)


def spawn_then_hang(pid_file: str):
    """A candidate that starts a child (as nvcc or g++ would) and then hangs."""
    child = subprocess.Popen(["sleep", "300"])
    with open(pid_file, "w") as fh:
        fh.write(str(child.pid))
    time.sleep(3600)

"""The horus engine's import boundary: no Django, DRF or Celery, no app package (``core``, ``tuning``,
``scheduling`` outside horus, ``frontend``, ``config``); only Django-free ``common`` and the
``core.onnx_models`` feature engine (and that one lazily, in ``features.py``)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

HORUS = Path(__file__).resolve().parents[2] / "scheduling" / "horus"
FORBIDDEN = {"django", "rest_framework", "celery", "kombu", "core", "tuning", "frontend", "config", "scheduling"}
ALLOWED = ("common", "core.onnx_models")


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_horus_imports_stay_inside_the_engine_boundary():
    bad = [(p.name, m) for p in sorted(HORUS.glob("*.py")) for m in _imports(p)
           if m.split(".")[0] in FORBIDDEN and not any(m == a or m.startswith(a + ".") for a in ALLOWED)]
    assert bad == []
    onnx_users = sorted(p.name for p in HORUS.glob("*.py") if any(m.startswith("core.") for m in _imports(p)))
    assert onnx_users == ["features.py"]


def test_importing_horus_loads_no_django():
    code = ("import sys, importlib, pkgutil, scheduling.horus as h\n"
            "[importlib.import_module('scheduling.horus.' + m.name) for m in pkgutil.iter_modules(h.__path__)]\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework', 'celery'))\n"
            "print(bad)")
    root = str(HORUS.parents[1])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root, env=env)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr

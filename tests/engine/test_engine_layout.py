"""The engine's shape, checked where import-linter cannot look (it sees ``tvm`` only as a whole).

A measuring worker holds TVM's runtime only (no compiler, no MetaSchedule): every TVM import under
``tuning/engine/measuring/``, lazy ones included, must name a runtime module.
"""

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "tuning" / "engine"
RUNTIME_MODULES = {"tvm", "tvm.runtime", "tvm.base", "tvm_ffi", "tvm_ffi.libinfo"}


def _tvm_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] in ("tvm", "tvm_ffi")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("tvm", "tvm_ffi"):
            found.add(node.module)
    return found


def test_measuring_imports_only_tvms_runtime():
    offending = {str(p.relative_to(ENGINE)): sorted(_tvm_imports(p) - RUNTIME_MODULES)
                 for p in sorted((ENGINE / "measuring").glob("*.py"))}
    assert not {k: v for k, v in offending.items() if v}, offending


def test_the_check_sees_a_compiler_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from tvm.s_tir import meta_schedule\n    import tvm.relax\n")
    assert _tvm_imports(bad) - RUNTIME_MODULES == {"tvm.s_tir", "tvm.relax"}


def test_every_engine_module_fits_one_read():
    """One mechanism per folder, no module a newcomer must page through (issue 44: at most 500 lines)."""
    too_long = {str(p.relative_to(ENGINE)): n for p in ENGINE.rglob("*.py")
                if (n := len(p.read_text().splitlines())) > 500}
    assert not too_long, too_long

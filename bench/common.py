"""Small helpers shared by benchmark scripts (no Django)."""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def geomean(values: Iterable[float]) -> float | None:
    vals = [float(v) for v in values if v is not None and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def chosen_sides(ap, option: str, value: str, known: Iterable[str], always: Iterable[str]) -> list[str]:
    """The sides a comma list ``value`` of ``option`` names, plus the ``always`` ones, in ``known``'s order;
    an unknown name is an argparse error (``ap``)."""
    known = list(known)
    names = {name for name in value.split(",") if name}
    unknown = sorted(names - set(known))
    if unknown:
        ap.error(f"unknown {option} {', '.join(unknown)} (choose from {', '.join(known)})")
    return [side for side in known if side in names | set(always)]


def cpu_model(fields: dict[str, str]) -> str:
    """The CPU's model name from /proc/cpuinfo's ``fields`` (``targets.cpuinfo_fields``)."""
    return fields.get("model name") or platform.processor() or "unknown"


def cpu_id(fields: dict[str, str]) -> str:
    """The CPU's vendor family and model numbers ("family 25 model 1") from /proc/cpuinfo's ``fields``: cloud
    VMs of two generations can share a model name ("AMD EPYC" for Zen 3 and Zen 4 alike); empty where it
    does not say."""
    family, model = fields.get("cpu family"), fields.get("model")
    return f"family {family} model {model}" if family and model else ""


def machine_info(**extra) -> dict:
    from tuning.engine.compile.targets import cpuinfo_fields  # the reader the targets' CPU flags come from
    from tuning.engine.measuring.timer import cpu_caches  # the sysfs reader the evaluator's cache-fit rule uses

    cpuinfo = cpuinfo_fields()
    info = {
        "cpu": cpu_model(cpuinfo),
        "cpu_id": cpu_id(cpuinfo),
        "caches": cpu_caches(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    try:
        from importlib.metadata import version

        info["tvm"] = version("apache-tvm")
        info["tvm_ffi"] = version("apache-tvm-ffi")
    except Exception:  # noqa: BLE001
        pass
    info.update(provenance())
    info.update(extra)
    return info


def provenance() -> dict:
    """When and on which commit a result was measured, for bench/results/INDEX.md: ``date`` (UTC) and
    ``commit`` (short hash, ``+dirty`` when tracked files had changes); no commit outside a git checkout."""
    info = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return info
    info["commit"] = head + ("+dirty" if dirty else "")
    return info


def machine_cpu_secs() -> dict[str, float]:
    """This machine's CPU seconds so far, all cores together, from ``/proc/stat``: ``busy`` (user, nice,
    system, irq, softirq) and ``steal`` (taken by the hypervisor); empty where there is no /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return {}
    ticks = [int(x) for x in fields] + [0] * 8
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks[:8]
    return {"busy": (user + nice + system + irq + softirq) / hz, "steal": steal / hz}


def children_cpu_secs() -> float:
    """CPU seconds (user + system) of this process's finished children and everything they waited for."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_child(script: str, spec: dict, *, timeout: float, env: dict | None = None) -> dict:
    """Run ``python script --job <json>`` in a fresh interpreter; the child
    writes its result JSON to ``spec["out"]``. The result gets ``cpu``: the CPU seconds the child and
    its processes used, and the whole machine's busy and stolen CPU seconds over the same wall time
    (``busy_cores`` = the child's CPU seconds / wall: how many cores it kept busy on average)."""
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = str(ROOT) + (os.pathsep + child_env["PYTHONPATH"] if child_env.get("PYTHONPATH") else "")
    if env:
        child_env.update({k: str(v) for k, v in env.items()})
    cpu0, machine0, t0 = children_cpu_secs(), machine_cpu_secs(), time.perf_counter()
    proc = subprocess.run(
        [sys.executable, script, "--job", json.dumps(spec)],
        env=child_env,
        cwd=str(ROOT),
        timeout=timeout,
        capture_output=True,
        text=True,
    )
    out = Path(spec["out"])
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(
            f"child job {spec.get('label')} failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    wall = time.perf_counter() - t0
    cpu = children_cpu_secs() - cpu0
    machine1 = machine_cpu_secs()
    result = json.loads(out.read_text())
    if isinstance(result, dict):
        result["cpu"] = {"wall_s": wall, "cpu_s": cpu, "busy_cores": cpu / wall if wall > 0 else None,
                         **{f"machine_{k}_s": machine1[k] - machine0[k] for k in machine1 if k in machine0}}
    return result


def tuning_config(spec: dict, **extra):
    """The engine's TuningConfig for a child job's spec (the fields every tuning benchmark sets the same
    way: DOPpler measurement, the default evaluator unless the spec names one, the spec's budget and search);
    ``extra`` adds the rest. No compiled checkpoint unless ``extra`` asks for one: it spends a compile from one
    side's budget, and these benchmarks credit other mechanisms (vs_onnxruntime measures the product's default)."""
    from tuning.engine.config import TuningConfig
    from tuning.engine.measuring.timer import EvaluatorConfig

    extra.setdefault("compiled_checkpoint", False)
    return TuningConfig(
        target=spec["target"],
        max_trials=spec["trials"],
        trials_per_round=spec["per_round"],
        mode="doppler",
        threads=spec["threads"],
        work_dir=spec["work_dir"],
        seed=spec["seed"],
        evaluator=EvaluatorConfig.from_any(spec.get("evaluator")),
        search_population=spec.get("population"),
        genetic_num_iters=spec.get("genetic_iters"),
        **extra,
    )


def write_json(result: dict, json_path: str | None) -> None:
    """Write a benchmark's result JSON when asked (``json_path``), saying where."""
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {json_path}")


def write_result(result: dict, *, json_path: str | None, work_root: Path, keep: bool) -> None:
    """Write the result JSON when asked, and remove the work directories unless they are to be kept."""
    write_json(result, json_path)
    if not keep:
        shutil.rmtree(work_root, ignore_errors=True)


def fmt_s(v: float | None, unit: str = "s") -> str:
    if v is None:
        return "-"
    if unit == "us":
        return f"{v * 1e6:,.1f}"
    if unit == "ms":
        return f"{v * 1e3:,.3f}"
    return f"{v:,.1f}"

"""The Python side of bench/gpu_check.sh (run that: it finds the CUDA runtime and sets the limits).

python -m bench.gpu_check MODE ARCH WAYS: MODE check|prepare, ARCH sm_XY or "", WAYS all|window|budgets.
``budget_sweep`` takes any device's jobs and runner factory (nothing in it is CUDA's).
"""
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

CAND = Path("bench/gpu_candidates")
DOPS = [2, 4, 8]
BUDGET_DOPS = [2, 4]


def schedules():
    """A few tasks, each in several thread-binding variants (the candidates a GPU search measures)."""
    import tvm
    from tvm import s_tir
    from tuning.engine.testing import depthwise_conv2d_primfunc, matmul_primfunc

    tasks = {"matmul1024": matmul_primfunc(1024), "matmul512": matmul_primfunc(512),
             "dwconv": depthwise_conv2d_primfunc(1, 128, 56, 56, 3, 1, 1)}
    for name, func in tasks.items():
        for threads in (32, 64, 128, 256, 512, 1024):
            sch = s_tir.Schedule(tvm.IRModule({"main": func}))
            for block in sch.get_child_blocks(sch.get_sblock("root"))[:-1]:
                sch.compute_inline(block)  # e.g. padding: one kernel per candidate
            loops = sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[-1])
            spatial = loops[:2] if len(loops) > 2 else loops
            fused = sch.fuse(*spatial)
            bx, tx = sch.split(fused, [None, threads])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            yield f"{name}_t{threads}", sch.mod, func


def prepare(arch):
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tuning.engine.measuring.cuda_binaries import precompile_kernels
    from tuning.engine.measuring.measure import _jsonable

    if not arch:
        from tuning.engine.measuring.gpu_slots import require_gpus
        arch = require_gpus()[0].arch  # the target arch comes from the device
    target = tvm.target.Target({"kind": "cuda", "arch": arch, "host": {"kind": "llvm"}})
    CAND.mkdir(parents=True, exist_ok=True)
    manifest = {"arch": arch, "candidates": []}
    for name, mod, func in schedules():
        try:
            lib = tvm.compile(mod, target=target)
        except Exception as exc:  # noqa: BLE001 - an invalid variant is skipped, as a search would
            print(f"  build {name}: skipped ({str(exc).splitlines()[-1][:100]})")
            continue
        path = CAND / f"{name}.so"
        lib.export_library(str(path))
        # TVM 0.27 keeps the kernel as CUDA source and compiles it at load time; a runtime-only
        # worker takes this binary instead (tuning/engine/measuring/cuda_binaries.py)
        precompile_kernels(lib, arch, CAND / "cuda_bin")
        args = [_jsonable(a.as_json()) for a in ms.arg_info.ArgInfo.from_prim_func(func)]
        manifest["candidates"].append({"name": name, "path": str(path), "args_info": args})
    (CAND / "manifest.json").write_text(json.dumps(manifest, indent=1))
    size = sum(p.stat().st_size for p in CAND.rglob("*") if p.is_file())
    print(f"gpu_check: {len(manifest['candidates'])} CUDA candidates for {arch} in {CAND} ({size / 2**20:.2f} MiB)")


def energy_j(meter):
    return meter.read().joules if meter is not None else None


def timed_pass(runner, jobs, dop, meter):
    """One timed pass of ``jobs`` at ``dop`` through ``runner``: its outcomes, each candidate's mean
    latency (None where it failed), the wall seconds and the NVML joules (None without a meter)."""
    t0, e0 = time.perf_counter(), energy_j(meter)
    outcomes = [o for o, _ in runner._measure(jobs, dop)]
    wall, joules = time.perf_counter() - t0, (energy_j(meter) - e0) if meter else None
    return outcomes, [statistics.mean(o.run_secs) if o.run_secs else None for o in outcomes], wall, joules


def serial_pair(runs):
    """Two serial passes' latencies: each candidate's mean (None unless both timed it) and the
    serial-vs-serial noise of the candidates both timed."""
    return ([statistics.mean(p) if all(p) else None for p in zip(*runs)],
            [abs(a - b) / min(a, b) for a, b in zip(*runs) if a and b])


def budgets():
    """Evaluator budgets to sweep, the longest first (the reference the others are judged against): the
    previous GPU default (10 x 3 samples of at least 50 ms), TVM's own default, then shorter ones
    (``number`` is raised until one sample lasts min_repeat_ms, so number=1 is a floor). The platform's
    present default is among them (marked in the log)."""
    from tuning.engine.measuring.timer import EvaluatorConfig

    configs = [EvaluatorConfig(number=10, repeat=3, min_repeat_ms=50), EvaluatorConfig(number=3, repeat=1, min_repeat_ms=100),
               EvaluatorConfig(number=1, repeat=3, min_repeat_ms=20), EvaluatorConfig(number=1, repeat=3, min_repeat_ms=5),
               EvaluatorConfig(number=1, repeat=3, min_repeat_ms=1)]
    return {f"{c.number}x{c.repeat}>={c.min_repeat_ms}ms": c for c in configs}


def _ranks(values):
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    for r, i in enumerate(order):
        ranks[i] = float(r)
    return ranks


def spearman(a, b):
    """Rank correlation of two equally long lists (no ties expected among timings; numpy/scipy-free)."""
    ra, rb = _ranks(a), _ranks(b)
    n = len(a)
    if n < 2:
        return float("nan")
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else float("nan")


def pick_quality(timings, reference, names):
    """Per task (the name before "_t"): does this budget's fastest candidate equal the reference's, and how
    much slower (by the reference's timing) is the one it picked? That is what a search keeps."""
    tasks = {}
    for name, t, ref in zip(names, timings, reference):
        if t and ref:
            tasks.setdefault(name.rsplit("_t", 1)[0], []).append((t, ref, name))
    same, regrets = 0, []
    for rows in tasks.values():
        picked = min(rows)  # by this budget's timing
        best_ref = min(r for _, r, _ in rows)
        same += picked[1] == best_ref
        regrets.append(picked[1] / best_ref - 1)
    return {"tasks": len(tasks), "same_best": same, "max_regret": max(regrets, default=None)}


def budget_sweep(jobs, names, make_runner, group, budget_configs, dops, meter=None, log=print):
    """Each evaluator budget (``*`` in the log: the platform's default): serial twice (its wall, its own
    serial-vs-serial noise, its error, rank correlation and per-task pick against the first budget's mean,
    the reference), then the timing window at each DOP (speed-up over its own serial wall, error against
    its own serial mean). ``make_runner(evaluator, group)``
    returns a PooledAsyncRunner's plain object; ``group`` carries the timing lock (the platform's way)."""
    from tuning.engine.measuring.timer import default_evaluator

    rows, reference = [], None
    for label, evaluator in budget_configs.items():
        runner = make_runner(evaluator, group)
        try:
            runner._measure(jobs[:1], 1)  # warm the serial worker
            passes = [timed_pass(runner, jobs, 1, meter) for _ in range(2)]
            walls, joules = [w for _, _, w, _ in passes], [j for _, _, _, j in passes]
            ser, noise = serial_pair([lat for _, lat, _, _ in passes])
            if reference is None:
                reference = ser
            both = [(s, r) for s, r in zip(ser, reference) if s and r]
            row = {"budget": label, "evaluator": evaluator.to_dict(), "serial_s": statistics.mean(walls),
                   "serial_energy_j": joules[-1], "measured": len(both),
                   "serial_noise": statistics.mean(noise) if noise else None,
                   "serial_noise_max": max(noise, default=None),
                   "error_vs_first": statistics.mean(abs(s - r) / r for s, r in both) if both else None,
                   "spearman_vs_first": spearman([s for s, _ in both], [r for _, r in both]),
                   "per_task_pick": pick_quality(ser, reference, names), "window": []}
            for dop in dops:
                runner._measure(jobs[:dop], dop)  # start the DOP workers before timing
                _, par, wall, _ = timed_pass(runner, jobs, dop, meter)
                errs = [abs(p - s) / s for p, s in zip(par, ser) if p and s]
                row["window"].append({"dop": dop, "wall_s": wall, "speedup": row["serial_s"] / wall,
                                      "error": statistics.mean(errs) if errs else None, "measured": len(errs)})
                runner.retire_pools({1})
        finally:
            runner.shutdown()
        rows.append(row)
        pick = row["per_task_pick"]
        row["platform_default"] = evaluator == default_evaluator(jobs[0].device_type)
        log(f"  {label:12s}{'*' if row['platform_default'] else ' '} serial "
            f"{row['serial_s']:6.2f} s (x{rows[0]['serial_s'] / row['serial_s']:.2f} of the first)  noise "
            f"{_pct(row['serial_noise'])}  vs the first {_pct(row['error_vs_first'])}  Spearman "
            f"{row['spearman_vs_first']:.3f}  best per task {pick['same_best']}/{pick['tasks']} "
            f"(worst pick +{_pct(pick['max_regret'])})  energy {_num(row['serial_energy_j'])} J  window "
            + "  ".join(f"DOP {w['dop']} x{w['speedup']:.2f} err {_pct(w['error'])}" for w in row["window"]))
    return rows


def _pct(v):
    return "n/a" if v is None else f"{v:.2%}"


def _num(v):
    return "n/a" if v is None else f"{v:.1f}"


def check(ways):
    from tuning.engine.process import sandbox
    from tuning.engine.measuring.gpu_slots import (TIMING_LOCK_VAR, GpuSlotGroup, ensure_mps, gpu_slot_groups, mps_pipe_dir,
                                         require_gpus, stop_mps, timing_lock_path)
    from tuning.engine.runners.plugins import gpu_worker_slots
    from tuning.engine.runners.measure_jobs import MeasureJob
    from tuning.engine.runners.pooled import PooledAsyncRunner
    from tuning.engine.measuring.timer import default_evaluator

    gpus = require_gpus()
    if not (CAND / "manifest.json").exists():
        prepare(gpus[0].arch)
    manifest = json.loads((CAND / "manifest.json").read_text())
    if manifest["arch"] != gpus[0].arch:
        print(f"gpu_check: candidates built for {manifest['arch']}, device is {gpus[0].arch}: rebuilding")
        prepare(gpus[0].arch)
        manifest = json.loads((CAND / "manifest.json").read_text())
    try:
        from tuning.engine.energy import NvmlMeter
        meter = NvmlMeter(gpu_indices=[gpus[0].index])
    except Exception as exc:  # noqa: BLE001
        meter = None
        print(f"  NVML energy: unavailable ({exc})")
    # Workers load each kernel from the binaries built beside the candidates (cuda_bin/); what they must
    # compile here (nvcc, the device's arch) lands in a fresh cache, counted below (DLOPT_CUDA_* is on
    # the sandbox's allow-list, so the variable reaches the workers)
    from tuning.engine.measuring.cuda_binaries import CACHE_DIR_VAR
    import tempfile
    compiled_here = Path(tempfile.mkdtemp(prefix="gpu-check-nvcc-"))
    os.environ[CACHE_DIR_VAR] = str(compiled_here)
    jobs = [MeasureJob(path=str(Path(c["path"]).resolve()), device_type="cuda", args_info=c["args_info"]) for c in manifest["candidates"]]
    cores = sorted(os.sched_getaffinity(0))
    print(f"gpu_check: {gpus[0].name} ({gpus[0].arch}), {len(jobs)} candidates, {len(cores)} cores")

    names = [c["name"] for c in manifest["candidates"]]

    def make_runner(group, evaluator=None):
        # The runner's plain Python object (``_cls``): its TVM-facing wrapper needs the compiler
        # library, and a GPU host may carry TVM's runtime only. Limits as a GPU worker has them.
        return PooledAsyncRunner._cls(evaluator=evaluator or default_evaluator("cuda"), threads=1, dop=1,
                                      slots=gpu_worker_slots(group, cores), worker_env=group.env, timeout_sec=60,
                                      worker_limits=sandbox.default_limits(gpu=True))

    plain = {"CUDA_VISIBLE_DEVICES": gpus[0].uuid or str(gpus[0].index)}
    windowed = dict(plain, **{TIMING_LOCK_VAR: timing_lock_path(gpus[0])})
    if ways == "budgets":
        # The evaluator budget: how long each candidate is timed (no MPS: the window's error was the same
        # with it and without, gpu_check_h200_s19_prebuilt_window.json)
        print(f"gpu_check: evaluator budgets (serial twice, then the timing window at DOP {BUDGET_DOPS})")
        rows = budget_sweep(jobs, names, lambda ev, g: make_runner(g, ev),
                            GpuSlotGroup(gpus[0], max(BUDGET_DOPS), False, windowed), budgets(), BUDGET_DOPS, meter)
        out = os.environ.get("OUT")
        if out:
            Path(out, "gpu_check_budgets.json").write_text(json.dumps(
                {"gpu": gpus[0].name, "arch": gpus[0].arch, "candidates": len(jobs),
                 "energy": "NVML, measured" if meter else None, "budgets": rows}, indent=1))
        return 0

    def measure_setting(setting, variants, dops):
        """Serial twice on the first variant (the reference and its noise floor), then each variant
        at each DOP; errors against the mean serial timing."""
        serial_walls, serial_runs = [], []
        runner = make_runner(variants[0][1])
        try:
            runner._measure(jobs[:1], 1)  # warm the serial worker (CUDA context, module loader)
            for _ in range(2):
                outcomes, latencies, wall, e_serial = timed_pass(runner, jobs, 1, meter)
                serial_walls.append(wall)
                failed = [o.error for o in outcomes if o.error]
                if failed:
                    print(f"  {setting} serial: {len(failed)} of {len(jobs)} candidates failed; first error:\n    "
                          + failed[0].strip().replace("\n", "\n    ")[-1500:])
                if len(failed) == len(jobs):
                    return None
                serial_runs.append(latencies)
        finally:
            runner.shutdown()
        ser, noise = serial_pair(serial_runs)
        t_serial = statistics.mean(serial_walls)
        print(f"  {setting:18s} serial  wall {t_serial:6.2f} s  serial-vs-serial {statistics.mean(noise):.2%} "
              f"(max {max(noise):.2%})  energy {e_serial if e_serial is None else round(e_serial, 1)} J")
        rows = []
        for label, group in variants:
            runner = make_runner(group)
            try:
                for dop in dops:
                    runner._measure(jobs[:dop], dop)  # start the DOP workers before timing
                    _, par, wall, joules = timed_pass(runner, jobs, dop, meter)
                    per = {n: (p - s) / s for n, p, s in zip(names, par, ser) if p and s}
                    errs = [abs(v) for v in per.values()]
                    err = statistics.mean(errs) if errs else float("nan")
                    speed = t_serial / wall if wall else float("nan")
                    good = err <= 0.05 and speed >= 1.2
                    rows.append({"mechanism": label, "dop": dop, "error": err, "error_max": max(errs, default=None),
                                 "signed_median": statistics.median(per.values()) if per else None,
                                 "speedup": speed, "wall_s": wall, "energy_j": joules, "measured": len(errs),
                                 "ok": good, "per_candidate_signed_error": per})
                    print(f"  {label:18s} DOP {dop}   wall {wall:6.2f} s  speed-up x{speed:.2f}  mean error {err:.2%} "
                          f"(max {max(errs, default=float('nan')):.2%}, signed median {rows[-1]['signed_median'] or 0:+.2%})  "
                          f"energy {joules if joules is None else round(joules, 1)} J  {'ok' if good else '-'}")
                    runner.retire_pools({1})
            finally:
                runner.shutdown()
        return {"serial_s": t_serial, "serial_noise": statistics.mean(noise), "serial_energy_j": e_serial,
                "per_candidate_serial_s": dict(zip(names, ser)), "rows": rows}

    # Without MPS the driver time-slices the workers' contexts; measured first, before an MPS daemon
    # exists. "concurrent": candidates timed at the same time (the ablation); "window": the platform's
    # way, prepared in parallel and timed one at a time under the GPU's timing lock.
    concurrent_too = ways == "all"  # --window-only: the platform's ways alone (a shorter run)
    results = {"no-mps": measure_setting("no MPS", [
        *([("no MPS, concurrent", GpuSlotGroup(gpus[0], max(DOPS), False, plain))] if concurrent_too else []),
        ("no MPS, window", GpuSlotGroup(gpus[0], max(DOPS), False, windowed))], DOPS)}
    mps = ensure_mps(mps_pipe_dir())
    print(f"  MPS: {'on (' + mps.reason + ')' if mps.running else 'OFF: ' + mps.reason}")
    try:
        if mps.running:
            results["mps"] = measure_setting("MPS", [
                *([("MPS, concurrent", gpu_slot_groups(gpus[:1], mps, max(DOPS), exclusive_timing=False)[0])]
                  if concurrent_too else []),
                ("MPS, window", gpu_slot_groups(gpus[:1], mps, max(DOPS))[0])], DOPS)
    finally:
        stop_mps(mps)  # a daemon this check started goes with it
    platform = "MPS, window" if mps.running else "no MPS, window"
    ok = any(r["ok"] for res in results.values() if res for r in res["rows"] if r["mechanism"] == platform)
    n_compiled = len(list(compiled_here.glob("*.fatbin")))
    print(f"  kernels compiled on this host (not found among the prebuilt binaries): {n_compiled}")
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_check.json").write_text(json.dumps(
            {"gpu": gpus[0].name, "arch": gpus[0].arch, "mps": mps.running, "mps_reason": mps.reason,
             "kernels_compiled_on_host": n_compiled,
             "energy": "NVML, measured" if meter else None, "candidates": len(jobs), "results": results,
             "overall": {"pass": ok, "platform_mechanism": platform,
                         "best": max((r for res in results.values() if res for r in res["rows"]
                                      if r["mechanism"] == platform and r["ok"]),
                                     key=lambda r: r["speedup"], default=None)}},
            indent=1))
    if all(res is None for res in results.values()):
        print("gpu_check: FAIL (no candidate could be measured on this GPU)")
        return 1
    print(f"gpu_check: PASS ({platform})" if ok else
          f"gpu_check: FAIL (no DOP > 1 of {platform} with error <= 5 % and speed-up >= 1.2x)")
    return 0 if ok else 1


def main(argv):
    mode, arch, ways = argv[1], argv[2] or None, argv[3]
    # `timeout` ends this with SIGTERM: unwind, so the finally blocks stop the MPS daemon and the workers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("gpu_check: stopped by its time limit"))
    try:
        return (prepare(arch) or 0) if mode == "prepare" else check(ways)
    except Exception as exc:  # noqa: BLE001
        from tuning.engine.measuring.gpu_slots import NeedsGPU
        if isinstance(exc, NeedsGPU):
            print(f"gpu_check: no GPU here ({exc}). Exit 0.")
            return 0
        raise


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""CPU measurement slots: which cores each parallel measuring worker owns.

A *slot* is a set of T cores, T being the run's deployment thread count, so a candidate measured in a
slot runs the same program the same way as the serial reference (T threads, on slot 0, while every
other slot is idle). DOP <= number of slots <= floor(usable cores / T).

What counts as a usable core:

* only CPUs in this process's affinity mask (a container or ``taskset`` may give fewer than
  ``os.cpu_count()``);
* one hardware thread per physical core when the physical cores suffice for a slot: two slots on
  SMT siblings share one core's execution units and would measure each other; the siblings are left
  idle. When T exceeds the physical cores (a deployment that uses every hardware thread), slots are
  made of hardware threads instead;
* a slot stays inside one NUMA node when a node has T such cores (remote memory would slow that
  slot only); otherwise (T larger than every node) a slot may span nodes.

Everything reads a ``sys_root`` (``/sys/devices/system``) and an affinity set passed in, so tests
build fake trees; nothing here imports TVM.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["Slot", "CpuTopology", "parse_cpu_list", "read_topology", "plan_slots", "cpu_slots"]

SYS_ROOT = "/sys/devices/system"


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(out))


@dataclasses.dataclass(frozen=True)
class Slot:
    index: int
    cpus: tuple[int, ...]  # the CPUs the worker is pinned to (len == threads)
    threads: int
    node: int | None = None  # NUMA node, None when the slot spans nodes

    def as_layout(self) -> tuple[list[int], int]:
        return list(self.cpus), self.threads


@dataclasses.dataclass(frozen=True)
class CpuTopology:
    cpus: tuple[int, ...]  # usable CPUs (the affinity mask)
    cores: tuple[tuple[int, ...], ...]  # physical cores: the usable hardware threads of each, sorted
    node_of: dict[int, int]  # CPU -> NUMA node (0 when the machine reports none)

    @property
    def smt(self) -> bool:
        return any(len(c) > 1 for c in self.cores)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _numa_nodes(sys_root: Path) -> dict[int, int]:
    node_of: dict[int, int] = {}
    node_dir = sys_root / "node"
    for entry in sorted(node_dir.glob("node[0-9]*")) if node_dir.is_dir() else []:
        text = _read(entry / "cpulist")
        if text is not None:
            for cpu in parse_cpu_list(text):
                node_of[cpu] = int(entry.name[4:])
    return node_of


def read_topology(sys_root: str | os.PathLike = SYS_ROOT, affinity: Iterable[int] | None = None) -> CpuTopology:
    """The usable CPUs, grouped by physical core (SMT siblings) and NUMA node."""
    root = Path(sys_root)
    if affinity is None:
        from tuning.engine.process.procpool import available_cpus

        affinity = available_cpus()
    usable = sorted(set(affinity))
    cores: dict[tuple[int, ...], list[int]] = {}
    for cpu in usable:
        text = _read(root / "cpu" / f"cpu{cpu}" / "topology" / "thread_siblings_list")
        siblings = tuple(parse_cpu_list(text)) if text else (cpu,)
        cores.setdefault(siblings, []).append(cpu)
    node_of = _numa_nodes(root)
    return CpuTopology(
        cpus=tuple(usable),
        cores=tuple(sorted(tuple(sorted(v)) for v in cores.values())),
        node_of={c: node_of.get(c, 0) for c in usable},
    )


def _units(topo: CpuTopology, threads: int) -> list[int]:
    """The CPUs slots are cut from: one per physical core when they suffice, else every thread."""
    if len(topo.cores) >= threads:
        return [core[0] for core in topo.cores]
    return list(topo.cpus)


def plan_slots(topo: CpuTopology, threads: int) -> list[Slot]:
    """Disjoint slots of ``threads`` CPUs each (at least one slot: a machine smaller than T gets one
    slot of every usable CPU, and T is lowered to fit)."""
    threads = max(1, int(threads))
    units = _units(topo, threads)
    if len(units) < threads:
        return [Slot(0, tuple(units), len(units), _single_node(topo, units))]
    by_node: dict[int, list[int]] = {}
    for cpu in units:
        by_node.setdefault(topo.node_of.get(cpu, 0), []).append(cpu)
    groups: list[tuple[int, ...]] = []
    for node in sorted(by_node):
        cpus = by_node[node]
        groups.extend(tuple(cpus[i : i + threads]) for i in range(0, len(cpus) - threads + 1, threads))
    if not groups:  # T larger than every NUMA node: slots span nodes
        groups = [tuple(units[i : i + threads]) for i in range(0, len(units) - threads + 1, threads)]
    return [Slot(i, g, threads, _single_node(topo, g)) for i, g in enumerate(groups)]


def _single_node(topo: CpuTopology, cpus: Iterable[int]) -> int | None:
    nodes = {topo.node_of.get(c, 0) for c in cpus}
    return nodes.pop() if len(nodes) == 1 else None


def cpu_slots(threads: int, cpu_ids: Iterable[int] | None = None, sys_root: str | os.PathLike = SYS_ROOT) -> list[Slot]:
    """This machine's slots for a deployment of ``threads`` threads (``cpu_ids``: restrict to these)."""
    return plan_slots(read_topology(sys_root, cpu_ids), threads)

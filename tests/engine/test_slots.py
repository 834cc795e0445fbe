"""CPU measurement slots from fake /sys trees and affinity masks (pure, no TVM)."""

import pytest

from tuning.engine.measuring.slots import parse_cpu_list, plan_slots, read_topology


def fake_sys(tmp_path, siblings: dict[int, str], nodes: dict[int, str] | None = None):
    """A /sys/devices/system tree: cpuN/topology/thread_siblings_list and nodeN/cpulist."""
    for cpu, text in siblings.items():
        d = tmp_path / "cpu" / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(text + "\n")
    for node, text in (nodes or {}).items():
        d = tmp_path / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(text + "\n")
    return tmp_path


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("") == []


def test_two_plain_cores_give_two_one_thread_slots_or_one_two_thread_slot(tmp_path):
    root = fake_sys(tmp_path, {0: "0", 1: "1"})
    topo = read_topology(root, affinity={0, 1})
    assert [s.cpus for s in plan_slots(topo, 1)] == [(0,), (1,)]
    (slot,) = plan_slots(topo, 2)  # deployment on both cores: one slot, DOP 1 only
    assert slot.cpus == (0, 1) and slot.threads == 2


def test_smt_siblings_never_hold_two_slots(tmp_path):
    # 4 physical cores x 2 threads: cpu i and i+4 are siblings
    root = fake_sys(tmp_path, {c: f"{c % 4},{c % 4 + 4}" for c in range(8)})
    topo = read_topology(root, affinity=range(8))
    assert topo.smt and len(topo.cores) == 4
    slots = plan_slots(topo, 1)
    assert [s.cpus for s in slots] == [(0,), (1,), (2,), (3,)]  # DOP <= 4 physical cores, not 8
    assert [s.cpus for s in plan_slots(topo, 2)] == [(0, 1), (2, 3)]
    (wide,) = plan_slots(topo, 8)  # a deployment on every hardware thread: one slot of all of them
    assert sorted(wide.cpus) == list(range(8)) and wide.threads == 8


def test_affinity_mask_is_honoured(tmp_path):
    root = fake_sys(tmp_path, {c: f"{c % 4},{c % 4 + 4}" for c in range(8)})
    topo = read_topology(root, affinity={2, 3, 6})  # taskset / a container's cpuset
    assert topo.cpus == (2, 3, 6)
    assert [s.cpus for s in plan_slots(topo, 1)] == [(2,), (3,)]  # 6 is 2's sibling
    (slot,) = plan_slots(topo, 3)
    assert slot.cpus == (2, 3, 6)


def test_slots_stay_inside_numa_nodes(tmp_path):
    root = fake_sys(tmp_path, {c: str(c) for c in range(6)}, nodes={0: "0-2", 1: "3-5"})
    topo = read_topology(root, affinity=range(6))
    slots = plan_slots(topo, 2)
    # floor(3 / 2) per node: (0, 1) and (3, 4); cpu 2 and 5 stay idle rather than a cross-node slot
    assert [(s.cpus, s.node) for s in slots] == [((0, 1), 0), ((3, 4), 1)]
    (span,) = plan_slots(topo, 4)  # larger than any node: a slot spans them
    assert span.cpus == (0, 1, 2, 3) and span.node is None


@pytest.mark.parametrize("n_cpus", [1, 2, 3, 8, 16])
@pytest.mark.parametrize("threads", [1, 2, 4, 16])
def test_slots_never_oversubscribe(tmp_path, n_cpus, threads):
    root = fake_sys(tmp_path, {c: str(c) for c in range(n_cpus)})
    slots = plan_slots(read_topology(root, affinity=range(n_cpus)), threads)
    used = [c for s in slots for c in s.cpus]
    assert len(used) == len(set(used)) <= n_cpus
    assert all(len(s.cpus) == s.threads for s in slots)
    assert len(slots) == max(1, n_cpus // threads)


def test_missing_sys_tree_means_one_core_per_cpu(tmp_path):
    topo = read_topology(tmp_path / "absent", affinity={0, 1, 2})
    assert len(plan_slots(topo, 1)) == 3

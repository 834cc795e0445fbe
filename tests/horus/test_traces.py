"""Trace parsing (bundled copies, uploads, malformed rows) and workload assignment."""

from __future__ import annotations

import gzip
import io

import pytest

from scheduling.horus.profiles import ProfileTable, load_profiles
from scheduling.horus.traces import (
    TraceFormatError,
    alibaba_cluster,
    assign_workloads,
    cap_durations,
    compress_time,
    load_alibaba_nodes,
    load_alibaba_pods,
    load_philly,
    parse_trace,
    time_slice,
)

from .helpers import job

PHILLY_HEAD = "timestamp,duration,num_gpus,gpu_time,cluster\n"
PODS_HEAD = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
NODES_HEAD = "sn,cpu_milli,memory_mib,gpu,model\n"


def test_bundled_traces_parse():
    philly = load_philly()
    assert len(philly) == 82247
    assert philly[0].submit_time == 0 and all(a.submit_time <= b.submit_time for a, b in zip(philly, philly[1:]))
    assert sum(j.num_gpus == 1 for j in philly) / len(philly) > 0.9
    pods = load_alibaba_pods()  # CPU-only pods kept (FGD's workload counts them)
    assert len(pods) == 8152 and all(p.single_node for p in pods)
    assert sum(p.num_gpus == 0 for p in pods) == 1088 and all(p.gpu_milli == 0 for p in pods if p.num_gpus == 0)
    assert len(load_alibaba_pods(gpu_only=True)) == 7064
    assert sum(0 < p.gpu_milli < 1000 for p in pods) == 3078
    nodes = load_alibaba_nodes()
    assert len(nodes) == 1213 and sum(n.num_gpus for n in nodes) == 6212
    spec = alibaba_cluster(nodes)
    assert spec.enforce_milli and spec.n_gpus == 6212


def test_artifact_pod_lists_are_shipped_traces():
    from scheduling.horus.experiments import (
        SHIPPED_TRACES,
        ExperimentError,
        ExperimentParams,
        load_jobs,
        prepare_experiment,
    )

    expect = {"alibaba_gpushare40": (8152, 4001, 62), "alibaba_gpushare100": (8152, 7064, 0),
              "alibaba_multigpu20": (8324, 3078, 247)}  # pods, GPU-sharing pods, multi-GPU pods
    for name, (n, share, multi) in expect.items():
        assert name in SHIPPED_TRACES
        kind, pods = load_jobs(name)
        assert kind == "alibaba_pods" and len(pods) == n
        assert sum(0 < p.gpu_milli < 1000 for p in pods) == share and sum(p.num_gpus > 1 for p in pods) == multi
    # multigpu20 carries no times: a replay of it would be all pods at t=0 for 1 s, so it is refused
    kind, pods = load_jobs("alibaba_multigpu20")
    params = ExperimentParams(method="replay", predictions="oracle").validate(kind)
    with pytest.raises(ExperimentError, match="no creation/deletion times"):
        prepare_experiment(kind, pods, params, seed=0, profiles=load_profiles())


def test_upload_file_like_text_bytes_and_gzip():
    text = PHILLY_HEAD + "2017-10-09 07:01:55,66.0,1,66.0,c\n2017-10-09 07:00:55,10,2,20,c\n"
    a = load_philly(io.StringIO(text), name="up.csv")
    b = load_philly(io.BytesIO(text.encode()), name="up.csv")
    c = load_philly(io.BytesIO(gzip.compress(text.encode())), name="up.csv.gz")
    assert [(j.submit_time, j.num_gpus) for j in a] == [(0.0, 2), (60.0, 1)]
    assert [j.job_id for j in a] == [j.job_id for j in b] == [j.job_id for j in c]
    assert parse_trace(io.BytesIO(text.encode()), name="x.csv").kind == "philly"
    assert parse_trace(io.BytesIO((NODES_HEAD + "n1,64000,262144,2,T4\n").encode())).kind == "alibaba_nodes"
    pod = PODS_HEAD + "p1,6000,12288,1,460,,LS,Running,100,200,100\n"
    td = parse_trace(io.BytesIO(pod.encode()), name="pods.csv")
    assert td.kind == "alibaba_pods" and td.jobs[0].gpu_milli == 460 and td.jobs[0].duration_s == 100


@pytest.mark.parametrize(
    "body, line, column, msg",
    [
        ("2017-10-09 07:01:55,abc,1,66.0,c\n", 2, "duration", "expected a number"),
        ("2017-10-09 07:01:55,5,1,5,c\n2017-13-09 07:01:55,5,1,5,c\n", 3, "timestamp", "YYYY-MM-DD"),
        ("2017-10-09 07:01:55,-5,1,5,c\n", 2, "duration", ">= 0"),
        ("2017-10-09 07:01:55,5,0,5,c\n", 2, "num_gpus", ">= 1"),
        ("2017-10-09 07:01:55,5,1.5,5,c\n", 2, "num_gpus", "integer"),
        ("2017-10-09 07:01:55,5\n", 2, None, "expected 5 fields"),
    ],
)
def test_philly_malformed_rows(body, line, column, msg):
    with pytest.raises(TraceFormatError) as e:
        load_philly(io.StringIO(PHILLY_HEAD + body), name="philly-up.csv")
    err = e.value
    assert (err.file, err.line, err.column) == ("philly-up.csv", line, column)
    assert msg in str(err) and "philly-up.csv" in str(err) and f"line {line}" in str(err)


def test_missing_column_and_unknown_format():
    with pytest.raises(TraceFormatError, match=r"line 1, column 'num_gpus'.*lacks"):
        load_philly(io.StringIO("timestamp,duration\n2017-10-09 07:01:55,5\n"), name="p.csv")
    with pytest.raises(TraceFormatError, match="unknown trace format"):
        parse_trace(io.BytesIO(b"a,b,c\n1,2,3\n"), name="x.csv")
    with pytest.raises(TraceFormatError, match="empty file"):
        load_philly(io.StringIO(""), name="e.csv")
    with pytest.raises(TraceFormatError, match="binary content"):  # a NUL byte: binary, whatever the encoding
        load_philly(io.BytesIO(b"\xff\xfe\x00bad"), name="b.csv")
    with pytest.raises(TraceFormatError, match="not UTF-8"):
        load_philly(io.BytesIO(b"timestamp,duration,num_gpus\n\xff\xfebad\n"), name="b.csv")


@pytest.mark.parametrize(
    "row, column, msg",
    [
        ("p1,6000,12288,1,1460,,LS,Running,0,10,0", "gpu_milli", "<= 1000"),
        ("p1,6000,12288,2,500,,LS,Running,0,10,0", "gpu_milli", "whole GPUs"),
        ("p1,6000,12288,1,0,,LS,Running,0,10,0", "gpu_milli", "gpu_milli 0"),
        ("p1,6000,12288,1,500,,LS,Running,50,10,50", "deletion_time", "before created"),
        ("p1,6k,12288,1,500,,LS,Running,0,10,0", "cpu_milli", "integer"),
        (",6000,12288,1,500,,LS,Running,0,10,0", "name", "empty pod name"),
    ],
)
def test_alibaba_pod_malformed_rows(row, column, msg):
    with pytest.raises(TraceFormatError) as e:
        load_alibaba_pods(io.StringIO(PODS_HEAD + "p0,1000,1024,1,500,,LS,Running,0,5,0\n" + row + "\n"), name="pods.csv")
    assert (e.value.line, e.value.column) == (3, column)
    assert msg in str(e.value)


def test_alibaba_duplicate_and_node_errors():
    with pytest.raises(TraceFormatError, match="duplicate pod"):
        load_alibaba_pods(io.StringIO(PODS_HEAD + "p,1,1,1,500,,LS,Running,0,5,0\np,1,1,1,500,,LS,Running,0,5,0\n"))
    with pytest.raises(TraceFormatError, match=r"line 2, column 'model'"):
        load_alibaba_nodes(io.StringIO(NODES_HEAD + "n1,64000,262144,2,\n"), name="nodes.csv")
    nodes = load_alibaba_nodes(io.StringIO(NODES_HEAD + "n0,32000,262144,0,\nn1,64000,262144,2,T4\n"))
    assert [n.name for n in nodes] == ["n1"] and nodes[0].gpu_mem_mb == 15360


def test_shaping_helpers():
    jobs = [job("a", 100, 10), job("b", 200, 5000), job("c", 400, 10)]
    assert [j.submit_time for j in compress_time(jobs, 10)] == [0, 10, 30]
    assert [j.job_id for j in time_slice(jobs, 150, 300)] == ["b", "c"]
    assert time_slice(jobs, 150, 300)[0].submit_time == 50
    assert [j.duration_s for j in cap_durations(jobs, 1000)] == [10, 1000, 10]


def test_assign_workloads_seeded_and_separates_truth_from_prediction():
    table = ProfileTable(load_profiles(), "V100")
    jobs = load_philly()[:500]
    preds = {k: (50.0, 1234.0) for k in table.keys}
    a = assign_workloads(jobs, table, predictions=preds, seed=3)
    b = assign_workloads(jobs, table, predictions=preds, seed=3)
    c = assign_workloads(jobs, table, predictions=preds, seed=4)
    assert [(j.model, j.batch_size) for j in a] == [(j.model, j.batch_size) for j in b]
    assert [(j.model, j.batch_size) for j in a] != [(j.model, j.batch_size) for j in c]
    for j in a:
        assert j.true_util_pct == table.util[(j.model, j.batch_size)]
        assert (j.pred_util_pct, j.pred_mem_mb) == (50.0, 1234.0)
    assert len({(j.model, j.batch_size) for j in a}) > 30  # "uniform" spreads over the configurations
    oracle = assign_workloads(jobs[:10], table, seed=0)
    assert all(j.pred_util_pct == j.true_util_pct for j in oracle)


def test_request_mapping_fits_the_pod_share():
    table = ProfileTable(load_profiles(), "V100")
    pods = assign_workloads(load_alibaba_pods()[:2000], table, seed=0)
    lowest = min(table.util.values())
    for p in pods:
        if 0 < p.gpu_milli < 1000:  # GPU-sharing pods (CPU-only pods have no share)
            assert p.true_util_pct <= max(p.gpu_milli / 10, lowest) + 1e-9

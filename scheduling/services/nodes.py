"""Nodes, their GPUs and telemetry: registration from an NVML reading, heartbeats, draining."""
from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import psutil
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from core.exceptions import ServiceError
from core.fieldtext import fit_to_field
from tuning.engine.process.isolate import call_isolated
from tuning.engine.compile.target_schema import valid_mcpu, valid_triple
from tuning.engine.compile.targets import host_cpu_facts
from tuning.engine.measuring.timer import host_llc_bytes

from .. import telemetry
from ..models import GPU, GpuTelemetry, Node, gpu_queue_name
from .placement import request_placement_pass
from .staff import require_staff

log = logging.getLogger(__name__)


@dataclass
class HostFacts:
    hostname: str
    cpu_cores: int
    memory_mb: int
    cpu_mcpu: str = ""
    cpu_triple: str = ""
    cpu_llc_bytes: int | None = None


# a last-level cache a node may report: from a small core's 64 KiB to far beyond today's largest (1.1 GiB)
LLC_BYTES_RANGE = (64 << 10, 64 << 30)


@functools.cache
def _llvm_cpu() -> tuple[str, str]:
    """This host's CPU and triple as LLVM names them, asked once per process of a child that loads TVM
    (a worker process must not: it forks); ("", "") when that fails, and the node's runs build generic code."""
    try:
        facts = call_isolated(host_cpu_facts, what="naming this host's CPU", scrub=True,
                              sandbox_user=True)
        return str(facts["mcpu"]), str(facts["triple"])
    except Exception:  # noqa: BLE001 - a node without a working TVM still registers
        log.warning("could not name this host's CPU for LLVM", exc_info=True)
        return "", ""


def local_host_facts() -> HostFacts:
    mem = int(psutil.virtual_memory().total // (1024 * 1024))
    mcpu, triple = _llvm_cpu()
    llc = host_llc_bytes()
    if llc is not None and not _is_cache_size(llc):  # an odd sysfs must not stop the node registering
        log.warning("this host's last-level cache reads %s bytes: not reported", llc)
        llc = None
    return HostFacts(hostname=socket.gethostname(), cpu_cores=os.cpu_count() or 0, memory_mb=mem,
                     cpu_mcpu=mcpu, cpu_triple=triple, cpu_llc_bytes=llc)


def _is_cache_size(value: object) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)
            and LLC_BYTES_RANGE[0] <= value <= LLC_BYTES_RANGE[1])


def _gpu_values(node: Node, sample: telemetry.GpuSample) -> dict[str, Any]:
    return {"uuid": fit_to_field(GPU, "uuid", sample.uuid), "name": fit_to_field(GPU, "name", sample.name),
            "gpu_model": fit_to_field(GPU, "gpu_model", sample.gpu_model),
            "memory_total_mb": sample.memory_total_mb, "power_limit_w": sample.power_limit_w,
            "queue": gpu_queue_name(node.name, sample.index), "present": True}


@transaction.atomic
def register_node(
    *,
    name: str,
    reading: telemetry.NvmlReading,
    hostname: str = "",
    cpu_cores: int = 0,
    memory_mb: int = 0,
    queues: list[str] | None = None,
    now: dt.datetime | None = None,
    cpu_mcpu: str = "",
    cpu_triple: str = "",
    cpu_llc_bytes: int | None = None,
) -> Node:
    """Create or refresh a node and its GPUs from an NVML reading (a host with no GPU registers none).

    ``queues`` are the Celery queues the calling worker consumes; they are merged with the ones
    other workers of the same node reported. GPUs the reading no longer shows are marked absent.
    """
    name = (name or "").strip()
    if not name:
        raise ServiceError("A node needs a name.", field="name")
    # runs build for the CPU a node names (its mcpu and triple reach LLVM): LLVM's names, nothing else
    if cpu_mcpu and not valid_mcpu(cpu_mcpu):
        raise ServiceError(f"cpu_mcpu {str(cpu_mcpu)[:40]!r} is not an LLVM CPU name.", field="cpu_mcpu")
    if cpu_triple and not valid_triple(cpu_triple):
        raise ServiceError(f"cpu_triple {str(cpu_triple)[:40]!r} is not an LLVM triple.", field="cpu_triple")
    # it decides how the runs measured on the node time their candidates (cold or warm)
    if cpu_llc_bytes is not None and not _is_cache_size(cpu_llc_bytes):
        raise ServiceError(f"cpu_llc_bytes {str(cpu_llc_bytes)[:40]!r} is not a cache size in bytes "
                           f"({LLC_BYTES_RANGE[0]} to {LLC_BYTES_RANGE[1]}).", field="cpu_llc_bytes")
    now = now or timezone.now()
    node, _ = Node.objects.select_for_update().get_or_create(name=name)
    node.hostname = hostname or node.hostname
    node.cpu_cores = cpu_cores or node.cpu_cores
    node.memory_mb = memory_mb or node.memory_mb
    node.cpu_mcpu = fit_to_field(Node, "cpu_mcpu", cpu_mcpu) or node.cpu_mcpu
    node.cpu_triple = fit_to_field(Node, "cpu_triple", cpu_triple) or node.cpu_triple
    node.cpu_llc_bytes = cpu_llc_bytes or node.cpu_llc_bytes
    node.queues = sorted(set(node.queues or []) | set(queues or []))
    node.nvml_available = reading.available
    node.nvml_error = "" if reading.available else reading.error
    node.driver_version = reading.driver_version
    node.last_seen = now
    node.save()
    seen = set()
    for s in reading.gpus:
        seen.add(s.index)
        values = _gpu_values(node, s)
        gpu = GPU.objects.filter(node=node, index=s.index).first()
        if gpu is None:
            GPU.objects.create(node=node, index=s.index, **values)
        elif any(getattr(gpu, k) != v for k, v in values.items()):
            for k, v in values.items():
                setattr(gpu, k, v)
            gpu.save(update_fields=list(values))
    GPU.objects.filter(node=node, present=True).exclude(index__in=seen).update(present=False)
    return node


@dataclass
class HeartbeatResult:
    node: str
    nvml_available: bool
    message: str
    samples: int = 0
    gpus: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "nvml_available": self.nvml_available, "message": self.message,
                "samples": self.samples, "gpus": self.gpus}


def record_heartbeat(
    *,
    node_name: str | None = None,
    queues: list[str] | None = None,
    nvml: Any = None,
    now: dt.datetime | None = None,
) -> HeartbeatResult:
    """Read this host's GPUs through NVML, register the node and store one telemetry sample per GPU.

    With no NVIDIA driver (or no GPU) the node is registered with no GPUs and the result says so.
    """
    name = node_name or settings.NODE_NAME
    now = now or timezone.now()
    reading = telemetry.read_gpus(nvml)
    facts = local_host_facts()
    with transaction.atomic():
        node = register_node(name=name, reading=reading, hostname=facts.hostname, cpu_cores=facts.cpu_cores,
                             memory_mb=facts.memory_mb, queues=queues, now=now, cpu_mcpu=facts.cpu_mcpu,
                             cpu_triple=facts.cpu_triple, cpu_llc_bytes=facts.cpu_llc_bytes)
        by_index = {g.index: g for g in GPU.objects.filter(node=node, present=True)}
        rows = [
            GpuTelemetry(gpu=by_index[s.index], ts=now, util_pct=s.util_pct, mem_used_mb=s.mem_used_mb,
                         mem_total_mb=s.memory_total_mb, power_w=s.power_w, temperature_c=s.temperature_c,
                         energy_mj=s.energy_mj)
            for s in reading.gpus if s.index in by_index
        ]
        GpuTelemetry.objects.bulk_create(rows)
    prune_telemetry(node=node)
    if reading.available:
        message = f"node {name}: {reading.summary}; stored {len(rows)} sample(s)"
    else:
        message = f"node {name} registered with no GPUs: {reading.summary}"
    log.info(message)
    return HeartbeatResult(node=name, nvml_available=reading.available, message=message, samples=len(rows),
                           gpus=[s.to_dict() for s in reading.gpus])


def prune_telemetry(*, node: Node | None = None, older_than: dt.timedelta | None = None) -> int:
    """Delete samples older than SCHEDULING_TELEMETRY_RETENTION_DAYS - of one node's GPUs, or all."""
    days = float(settings.SCHEDULING_TELEMETRY_RETENTION_DAYS)
    cutoff = timezone.now() - (older_than or dt.timedelta(days=days))
    qs = GpuTelemetry.objects.filter(ts__lt=cutoff)
    if node is not None:
        qs = qs.filter(gpu__node=node)
    deleted, _ = qs.delete()
    return deleted


def _set_drained(actor: AbstractBaseUser | None, row: Node | GPU, drained: bool, what: str) -> Node | GPU:
    """Drained nodes and GPUs get no new placements; undraining one asks for a placement pass."""
    require_staff(actor, f"drain or undrain {what}")
    row = type(row).objects.select_for_update().get(pk=row.pk)
    row.drained = drained
    row.save(update_fields=["drained"])
    if not drained:
        request_placement_pass()
    return row


@transaction.atomic
def set_node_drained(*, actor: AbstractBaseUser | None, node: Node, drained: bool) -> Node:
    return _set_drained(actor, node, drained, "nodes")


@transaction.atomic
def set_gpu_drained(*, actor: AbstractBaseUser | None, gpu: GPU, drained: bool) -> GPU:
    return _set_drained(actor, gpu, drained, "GPUs")

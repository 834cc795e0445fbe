"""A successful run's deployment package: the tuned module, its manifest and run.py in one zip."""
from __future__ import annotations

from core.exceptions import ServiceError
from tuning.adapters.package import USAGE, package_bytes
from tuning.models import TuningRun

__all__ = ["PackageUnavailable", "build_run_package", "package_filename", "package_usage"]


class PackageUnavailable(ServiceError):
    status = 404  # as the bare module's download: nothing to fetch yet


def package_filename(run: TuningRun) -> str:
    """Built from the run's id only: nothing a user named (the model's name) becomes a file name."""
    return f"run{int(run.pk)}-package.zip"


def package_usage(run: TuningRun) -> list[str]:
    """The three lines that use the package (the run page and docs print them)."""
    name = package_filename(run)
    folder = name.removesuffix(".zip")
    return [line.format(zip=name, dir=folder) for line in USAGE]


def build_run_package(*, run: TuningRun) -> bytes:
    """The zip bytes of `run`'s package; PackageUnavailable while the run has no compiled module."""
    if run.status != TuningRun.Status.SUCCEEDED or not run.module_file:
        raise PackageUnavailable("Not available yet: the run has not finished successfully with a compiled module.",
                                 code="not_available")
    if not run.model.file:
        raise PackageUnavailable("The run's model file is gone: its input signature cannot be read.",
                                 code="not_available")
    return package_bytes(run)

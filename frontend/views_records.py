"""Importing an existing TVM tuning database into a queued or paused run, from its page. The checks are the
API's (tuning.services.records.import_database: parsed by TVM in a sandbox, allow-listed, nothing written
on refusal); a refusal is shown as its list of reasons."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from core import services as core_services
from core.api.throttles import UploadThrottle, upload_throttled_message
from core.exceptions import ServiceError
from core.onnx_models.errors import OnnxValidationError
from tuning import services as tuning_services
from tuning.api.views import IMPORT_RECORDS_MAX_BYTES, IMPORT_WORKLOADS_MAX_BYTES

from . import queries
from .forms_account import RecordImportForm


def refusal_lines(message: str) -> list[str]:
    """A refusal's reasons, one a line (the service joins them with '; ' after IMPORT_REFUSED_PREFIX)."""
    prefix = tuning_services.IMPORT_REFUSED_PREFIX
    if not message.startswith(prefix):
        return [message]
    return [prefix.strip()] + [reason.strip() for reason in message[len(prefix):].split("; ") if reason.strip()]


@login_required
@require_POST
def run_import_records(request, pk: int):
    run = queries.run_for_user(request.user, pk)  # another team's run: 404
    form = RecordImportForm(request.POST, request.FILES)
    throttle = UploadThrottle()
    if not throttle.allow_request(request, None):
        messages.error(request, upload_throttled_message(throttle))
    elif not form.is_valid():
        messages.error(request, "Choose both files of the TVM database: database_workload.json and "
                                "database_tuning_record.json.")
    else:
        try:
            n = tuning_services.import_database(
                actor=request.user, run=run,
                workloads=core_services.read_upload(form.cleaned_data["workloads"],
                                                    max_bytes=IMPORT_WORKLOADS_MAX_BYTES),
                records=core_services.read_upload(form.cleaned_data["records"], max_bytes=IMPORT_RECORDS_MAX_BYTES))
        except (ServiceError, OnnxValidationError) as exc:
            for line in refusal_lines(exc.message):
                messages.error(request, line)
        else:
            messages.success(request, f"Imported {n} tuning record(s): the run measures each one itself before "
                                      "it seeds the search.")
    return redirect("run-detail", pk=run.pk)

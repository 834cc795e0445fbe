"""One run, the same numbers everywhere: the run page, the API, `dlopt runs show` and `manage.py tune`'s
summary all headline the compiled latency with its IQR next to onnxruntime's, call the estimate an
estimate, explain its gap, and give the same verdict."""
from __future__ import annotations

import html as htmllib
import io
import re

import pytest

from frontend.presenters import fmt_spread
from tests.client.test_cli_live import dlopt, logged_in  # noqa: F401 - fixtures
from tests.factories import TuningRunFactory
from tuning.management.commands.tune import Command as TuneCommand

pytestmark = pytest.mark.django_db(transaction=True)

NUMBERS = {"tuned_latency_s": 388.1e-6, "tuned_latency_iqr_s": 12.5e-6, "untuned_latency_s": 900e-6,
           "ort_latency_s": 273.0e-6, "ort_latency_iqr_s": 150.0e-6, "ratio_to_ort": 388.1 / 273.0,
           "estimated_latency_s": 220.7e-6, "verdict": "within noise", "outputs_match": True}
# the model compiled and timed once every task had a record (the engine's checkpoint)
CHECKPOINT = {"at": "first round", "trials": 48, "estimate_s": 250.0e-6, "compiled_s": 400.0e-6,
              "compiled_iqr_s": 10.0e-6, "compile_s": 2.0, "timing_s": 1.0, "wall_s": 3.5}


def test_page_api_and_clis_show_the_same_numbers(dlopt, logged_in, model_a, client, user_owner):  # noqa: F811
    run = TuningRunFactory(model=model_a, succeeded=True, **NUMBERS, summary={"compiled_checkpoint": CHECKPOINT})
    api = dlopt("runs", "show", run.pk, "--json").json  # the dlopt client's view is the API's body
    for field, value in NUMBERS.items():
        assert api[field] == pytest.approx(value) if isinstance(value, float) else api[field] == value, field
    assert api["deploy_verdict"] == run.deploy_verdict and "within noise" in api["deploy_verdict"]
    assert not api["faster_engine"]  # no winner is named within noise
    note = api["estimate_gap"]["note"]
    assert "76 % above the per-task estimate" in note
    assert api["compiled_checkpoint"] == CHECKPOINT
    checkpoint = api["checkpoint_note"]
    assert checkpoint == ("0.4 ms (IQR 0.01 ms) compiled after 48 trials, when the per-task estimate read 0.25 ms: "
                          "60 % above it")

    client.force_login(user_owner)
    html = htmllib.unescape(client.get(f"/runs/{run.pk}/").content.decode())
    page_tuned = fmt_spread(api["tuned_latency_s"], api["tuned_latency_iqr_s"])
    page_ort = fmt_spread(api["ort_latency_s"], api["ort_latency_iqr_s"])
    assert page_tuned == "388.1 µs (IQR 12.5 µs)" and page_ort == "273.0 µs (IQR 150.0 µs)"
    for text in (page_tuned, page_ort, api["deploy_verdict"], note, "Estimate (sum of per-task bests", checkpoint):
        assert text in html, text
    # the headline comes before the estimate
    assert html.index(page_tuned) < html.index("Estimate (sum of per-task bests")

    shown = dlopt("runs", "show", run.pk).out
    assert "tuned 0.3881 ms (IQR 0.0125 ms)" in shown and "onnxruntime 0.2730 ms (IQR 0.1500 ms)" in shown
    assert api["deploy_verdict"] in shown and note in shown and f"compiled checkpoint: {checkpoint}" in shown
    assert re.search(r"estimate \(sum of per-task bests, not measured end to end\): 0\.2207 ms", shown)

    summary = TuneCommand._summary(run, 1.0)
    assert summary["tuned_latency_ms"] == pytest.approx(0.3881)
    assert summary["tuned_latency_iqr_ms"] == pytest.approx(0.0125)
    assert summary["onnxruntime_latency_iqr_ms"] == pytest.approx(0.15) and summary["verdict"] == "within noise"
    out = io.StringIO()
    command = TuneCommand(stdout=out)
    command._print(summary)
    printed = out.getvalue()
    assert "tuned 0.3881 ms (IQR 0.0125 ms)" in printed and "onnxruntime: 0.2730 ms (IQR 0.1500 ms)" in printed
    assert api["deploy_verdict"] in printed and note in printed and f"Compiled checkpoint: {checkpoint}" in printed


def test_an_overloaded_timing_is_flagged_everywhere(dlopt, logged_in, model_a, client, user_owner):  # noqa: F811
    reason = "host load 7.10 was above the 2 core(s) the timing uses: the timings describe a contended machine"
    run = TuningRunFactory(model=model_a, succeeded=True, **{**NUMBERS, "verdict": "overloaded"},
                           verdict_flag=reason, timing_load=7.1)
    api = dlopt("runs", "show", run.pk, "--json").json
    assert api["verdict"] == "overloaded" and api["verdict_flag"] == reason and not api["faster_engine"]
    assert api["deploy_verdict"].startswith(f"No verdict: {reason}")
    client.force_login(user_owner)
    assert api["deploy_verdict"] in htmllib.unescape(client.get(f"/runs/{run.pk}/").content.decode())
    assert api["deploy_verdict"] in dlopt("runs", "show", run.pk).out

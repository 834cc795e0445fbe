"""The dashboard on a phone-sized screen and for assistive technology, in a real browser (Playwright on
Debian's Chromium): at 390x844 (a screenshot of each page goes to $DLOPT_SCREENSHOT_DIR) no page is wider than the screen (wide tables scroll inside their box, the
navigation collapses behind a Menu button), the 404 is the styled page, and axe-core finds no serious or
critical accessibility violation on the main pages.

axe-core is vendored in tests/frontend/vendor/ (MPL-2.0, see its README) and injected from the file: the
pages' Content-Security-Policy allows no inline script, so the axe context bypasses the CSP; the width
checks run with the CSP enforced, as a user's browser does.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from core.models import Quota
from tests.factories import TuningRunFactory

from .fakes import make_running_run
from .test_browser import (WAIT_MS, _page, browser, login, make_cluster_data, make_simulation,  # noqa: F401
                           shots)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
AXE = Path(__file__).parent / "vendor" / "axe.min.js"
BLOCKING_IMPACTS = ("serious", "critical")


@pytest.fixture
def site(user_owner, team_a, model_a):
    """Data behind every page: a running run with progress, a finished one, cluster telemetry and a job, a
    finished simulation; returns the paths to visit."""
    Quota.objects.filter(team=team_a).update(max_concurrent_runs=20, tuning_trials_per_month=1_000_000)
    running, _ = make_running_run(actor=user_owner, model=model_a, max_trials=200, n_tasks=4, rounds=3, per_round=16)
    done = TuningRunFactory(model=model_a, created_by=user_owner, succeeded=True, trials_done=64,
                            wall_seconds=120.0, energy_joules=3000.0, energy_build_joules=774.0,
                            energy_measure_joules=730.0, energy_source="modeled", trimmer_enabled=True,
                            candidates_generated=64, candidates_filtered=48, energy_saved_joules=0.0,
                            ort_latency_s=0.002)
    make_cluster_data(team_a, model_a)
    from scheduling.models import GpuJob

    job = GpuJob.objects.get()
    sim = make_simulation(team_a)
    return {
        "overview": "/", "models": "/models/", "model": f"/models/{model_a.pk}/", "upload": "/models/upload/",
        "runs": "/runs/", "start": f"/runs/new/?model={model_a.pk}", "run": f"/runs/{running.pk}/",
        "finished-run": f"/runs/{done.pk}/", "compare": f"/runs/compare/?runs={running.pk},{done.pk}",
        "cluster": "/cluster/", "job-new": "/cluster/jobs/new/", "job": f"/cluster/jobs/{job.pk}/",
        "simulations": "/simulations/", "simulation-new": "/simulations/new/", "simulation": f"/simulations/{sim.pk}/",
        "energy": "/energy/", "tokens": "/settings/tokens/", "teams": "/teams/", "team": f"/teams/{team_a.pk}/",
        "not-found": "/no-such-page/",
    }


def _settle(pg) -> None:
    """Wait until the page's charts are drawn (their size is part of the layout)."""
    pg.wait_for_load_state("load")
    for el in pg.query_selector_all("[data-figure]"):
        fid = el.get_attribute("data-figure")
        pg.wait_for_selector(f"[data-figure='{fid}'] svg.main-svg", timeout=WAIT_MS)


def _widest(pg) -> list[str]:
    """The elements that stick out past the screen's right edge (for a readable failure)."""
    return pg.evaluate("""() => {
        const w = document.documentElement.clientWidth, out = [];
        for (const el of document.querySelectorAll('body *')) {
            const r = el.getBoundingClientRect();
            if (r.right > w + 1 && r.width > 0) {
                let inScroller = false;
                for (let p = el.parentElement; p; p = p.parentElement) {
                    const s = getComputedStyle(p).overflowX;
                    if (s === 'auto' || s === 'scroll' || s === 'hidden') { inScroller = true; break; }
                }
                if (!inScroller) out.push(el.tagName + '#' + el.id + '.' + el.className + ' ' + Math.round(r.right));
            }
        }
        return out.slice(0, 8);
    }""")


def test_no_page_is_wider_than_a_phone(browser, live_server, site, shots):  # noqa: F811 - the imported fixture
    context = browser.new_context(viewport=PHONE, device_scale_factor=1, is_mobile=True, has_touch=True)
    pg = _page(context, live_server)
    login(pg, live_server)
    too_wide = {}
    for name, path in site.items():
        resp = pg.goto(live_server.url + path)
        assert resp.status == (404 if name == "not-found" else 200), (name, resp.status)
        _settle(pg)
        pg.screenshot(path=str(shots / f"phone-{name}.png"), full_page=True)
        width = pg.evaluate("document.scrollingElement.scrollWidth")
        header = pg.evaluate("document.querySelector('.topbar').getBoundingClientRect().width")
        if width > PHONE["width"] + 1 or header > PHONE["width"] + 1:
            too_wide[name] = (width, header, _widest(pg))
    assert too_wide == {}
    context.close()


def test_the_navigation_collapses_behind_a_menu_button(browser, live_server, site):  # noqa: F811
    context = browser.new_context(viewport=PHONE)
    pg = _page(context, live_server)
    login(pg, live_server)
    pg.goto(live_server.url + site["runs"])
    assert pg.is_visible(".nav-toggle") and pg.is_hidden("#mainnav")
    pg.click(".nav-toggle")
    assert pg.is_visible("#mainnav a[href='/models/']")
    assert pg.get_attribute(".nav-toggle", "aria-expanded") == "true"
    pg.click("#mainnav a[href='/models/']")
    pg.wait_for_url(live_server.url + "/models/")
    # on a wide screen the navigation is always shown and there is no Menu button
    pg.set_viewport_size({"width": 1280, "height": 900})
    assert pg.is_hidden(".nav-toggle") and pg.is_visible("#mainnav")
    assert pg.problems == []
    context.close()


def test_a_missing_page_is_the_styled_404_with_navigation(browser, live_server, user_owner, team_a):  # noqa: F811
    context = browser.new_context(viewport=PHONE)
    pg = _page(context, live_server)
    login(pg, live_server)
    resp = pg.goto(live_server.url + "/models/999999/")
    assert resp.status == 404
    assert pg.inner_text("h1") == "Page not found"
    assert pg.evaluate("getComputedStyle(document.querySelector('.topbar')).backgroundColor") == "rgb(31, 59, 87)"
    pg.click(".nav-toggle")
    pg.click("#mainnav a[href='/runs/']")
    pg.wait_for_url(live_server.url + "/runs/")
    context.close()


def test_the_start_form_shows_only_what_applies_as_it_changes(browser, live_server, site):  # noqa: F811
    context = browser.new_context(viewport=PHONE)
    pg = _page(context, live_server)
    login(pg, live_server)
    pg.goto(live_server.url + site["start"])
    assert pg.is_hidden("#trimmer-details") and pg.is_hidden("#fixed-dop")
    pg.check("#id_trimmer_enabled")
    assert pg.is_visible("#id_plateau_rounds")
    pg.check("#id_dop_mode_1")
    assert pg.is_visible("#id_dop_fixed")
    pg.check("#id_dop_mode_0")
    assert pg.is_hidden("#id_dop_fixed")
    pg.fill("#id_max_trials", "100")
    pg.wait_for_selector("#run-estimate-text:has-text('Estimate for 100 trials')")
    # the live gpu node of make_cluster_data reports 16 cores: 16 threads per measurement leave no room
    pg.fill("#id_num_cores", "16")
    assert pg.is_visible("#dop-note") and "DOP stays 1" in pg.inner_text("#dop-note")
    pg.fill("#id_num_cores", "4")
    assert pg.is_hidden("#dop-note")
    assert pg.problems == []
    context.close()


@pytest.mark.parametrize("viewport", [{"width": 1280, "height": 900}, PHONE], ids=["desktop", "phone"])
def test_main_pages_have_no_serious_accessibility_violations(browser, live_server, site, viewport):  # noqa: F811
    context = browser.new_context(viewport=viewport, bypass_csp=True)
    pg = _page(context, live_server)
    pg.goto(live_server.url + "/login/")
    found = {"login": _axe(pg)}
    login(pg, live_server)
    for name in ("overview", "models", "model", "upload", "runs", "start", "run", "compare", "cluster", "job-new",
                 "simulations", "simulation", "energy", "tokens", "teams", "team", "not-found"):
        pg.goto(live_server.url + site[name])
        _settle(pg)
        found[name] = _axe(pg)
    failing = {name: v for name, v in found.items() if v}
    assert not failing, "\n".join(f"{name}: {v}" for name, v in failing.items())
    context.close()


def _axe(pg) -> list[str]:
    pg.add_script_tag(path=str(AXE))
    result = pg.evaluate("() => axe.run(document, {resultTypes: ['violations']})")
    return [f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes'][:3]]}"
            for v in result["violations"] if v["impact"] in BLOCKING_IMPACTS]

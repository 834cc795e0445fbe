"""Every response carries a Content-Security-Policy that lets only this origin's script files run, and
no page needs more: no inline script, no event handler attribute, no script from elsewhere."""
from __future__ import annotations

import re

import pytest

from .test_pages import PAGES

pytestmark = pytest.mark.django_db

CSP = "Content-Security-Policy"


def _directives(header: str) -> dict[str, list[str]]:
    out = {}
    for part in filter(None, (p.strip() for p in header.split(";"))):
        name, *values = part.split()
        out[name] = values
    return out


def test_the_policy_runs_no_inline_or_foreign_script_and_allows_no_framing(settings):
    policy = _directives(settings.CONTENT_SECURITY_POLICY)
    assert policy["script-src"] == ["'self'"]  # no 'unsafe-inline', no 'unsafe-eval', no other host
    assert policy["default-src"] == ["'self'"] and policy["object-src"] == ["'none'"]
    assert policy["base-uri"] == ["'self'"] and policy["frame-ancestors"] == ["'none'"]
    assert policy["form-action"] == ["'self'"]


@pytest.mark.parametrize("url", ["/login/", "/api/", "/api/models/", "/no-such-page/"])
def test_anonymous_responses_carry_the_policy(client, settings, url):
    resp = client.get(url)
    assert resp[CSP] == settings.CONTENT_SECURITY_POLICY, (url, resp.status_code)


def _inline_scripts(html: str) -> list[str]:
    """<script> elements a browser would run that carry their code in the page (JSON data blocks,
    like the chart figures, are not run)."""
    found = []
    for attrs, body in re.findall(r"<script([^>]*)>(.*?)</script>", html, re.S | re.I):
        if "src=" in attrs:
            continue
        kind = re.search(r'type="([^"]+)"', attrs)
        if kind and kind.group(1) in ("application/json", "application/ld+json"):
            continue
        found.append(body.strip()[:80])
    return found


@pytest.mark.parametrize("url", PAGES)
def test_dashboard_pages_carry_the_policy_and_need_no_inline_script(owner_client, model_a, run_a, settings, url):
    resp = owner_client.get(url)
    assert resp.status_code == 200 and resp[CSP] == settings.CONTENT_SECURITY_POLICY
    html = resp.content.decode()
    assert _inline_scripts(html) == [], url
    assert not re.search(r"\son[a-z]+\s*=", html, re.I), url  # an onclick= would be blocked
    assert "javascript:" not in html.lower()


def test_chart_pages_need_no_inline_script(owner_client, model_a, run_a):
    for url in (f"/models/{model_a.pk}/", f"/runs/{run_a.pk}/", "/energy/"):
        html = owner_client.get(url).content.decode()
        assert "plotly" in html and _inline_scripts(html) == [], url


def test_a_team_supplied_script_in_a_name_is_escaped_and_would_not_run(owner_client, model_a, settings):
    """Defence in depth: a model named like a script is escaped by the templates, and were it not,
    the policy would not run it (no inline script is allowed)."""
    model_a.name = "<script>alert(1)</script>"
    model_a.save(update_fields=["name"])
    resp = owner_client.get(f"/models/{model_a.pk}/")
    html = resp.content.decode()
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "'unsafe-inline'" not in _directives(resp[CSP])["script-src"]


def test_the_api_docs_load_their_init_script_from_a_url(owner_client, settings):
    """Swagger UI's default page inlines its init script, which the policy would block."""
    html = owner_client.get("/api/docs/").content.decode()
    assert _inline_scripts(html) == []
    init = re.search(r'<script src="([^"]*script=[^"]*)"', html)
    assert init, "no init script URL on the docs page"
    script = owner_client.get(init.group(1).replace("&amp;", "&"))
    assert script.status_code == 200 and "SwaggerUIBundle" in script.content.decode()
    assert script[CSP] == settings.CONTENT_SECURITY_POLICY

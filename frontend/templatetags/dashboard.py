"""Template helpers of the dashboard: team switcher, number formats, chart slots."""
from __future__ import annotations

from django import template
from django.utils.html import format_html

from .. import presenters
from ..scope import get_scope

register = template.Library()


@register.inclusion_tag("frontend/partials/team_switcher.html", takes_context=True)
def team_switcher(context):
    request = context.get("request")
    if request is None or not request.user.is_authenticated:
        return {"show": False}
    scope = get_scope(request)
    return {"show": True, "scope": scope, "next": request.get_full_path(), "csrf_token": context.get("csrf_token")}


@register.filter
def latency(seconds):
    return presenters.fmt_latency(seconds)


@register.filter
def duration(seconds):
    return presenters.fmt_duration(seconds)


@register.filter
def target(target_dict):
    return presenters.fmt_target(target_dict)


@register.filter
def flops(value):
    return presenters.fmt_flops(value)


@register.filter
def carbon(grams):
    return presenters.fmt_carbon(grams)


@register.filter
def thousands(value):
    if value is None:
        return presenters.DASH
    return f"{value:,}"


@register.filter
def pct(fraction, digits=0):
    if fraction is None:
        return presenters.DASH
    return f"{fraction * 100:.{int(digits)}f}%"


@register.filter
def number(value, digits=2):
    return presenters.fmt_number(value, int(digits))


@register.simple_tag
def chart(figure_id: str, label: str, height: int = 360):
    """A chart slot: plotly.js draws the figure from the json_script #<figure_id>; without JS a note shows."""
    return format_html(
        # the label is on the figure, not on the drawing: Plotly puts buttons and legend toggles inside it,
        # and an element with role img may not hold interactive controls
        '<figure class="chart-box" aria-label="{}"><div class="chart" data-figure="{}" '
        'style="min-height:{}px"></div><noscript><p class="muted">Chart: {} (needs JavaScript; '
        'the table below has the same numbers).</p></noscript></figure>',
        label, figure_id, height, label)


@register.simple_tag(takes_context=True)
def pending_invitations(context):
    """The signed-in user's unanswered team invitations (the scope note points to them)."""
    from ..accountdata import invitations_for

    request = context.get("request")
    if request is None or not request.user.is_authenticated:
        return []
    return list(invitations_for(request.user))

"""The dashboard's team scope: the team picked in the switcher, or all the user's teams.

The choice lives in the session. List pages show the current scope; detail
pages accept any object of any of the user's teams (so a link from "all my
teams" keeps working after a switch) and 404 on everything else.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest

from core import selectors as core_selectors
from core.models import Team

SESSION_KEY = "dlopt_current_team"


@dataclass(frozen=True)
class Scope:
    teams: tuple[Team, ...]          # every team of the user
    current: Team | None             # None = "all my teams"
    writable_ids: frozenset[int]     # teams where the user is owner or member

    @property
    def team_ids(self) -> list[int]:
        """The teams list pages show."""
        if self.current is not None:
            return [self.current.pk]
        return [t.pk for t in self.teams]

    @property
    def all_team_ids(self) -> list[int]:
        return [t.pk for t in self.teams]

    @property
    def scoped_teams(self) -> list[Team]:
        return [self.current] if self.current is not None else list(self.teams)

    @property
    def writable_scoped_teams(self) -> list[Team]:
        return [t for t in self.scoped_teams if t.pk in self.writable_ids]

    @property
    def label(self) -> str:
        return self.current.name if self.current is not None else "All my teams"


def get_scope(request: HttpRequest) -> Scope:
    """The scope of this request (computed once per request)."""
    cached = getattr(request, "_dlopt_scope", None)
    if cached is not None:
        return cached
    teams = tuple(core_selectors.teams_for_user(request.user).order_by("name"))
    wanted = request.session.get(SESSION_KEY)
    current = next((t for t in teams if t.pk == wanted), None)
    if wanted is not None and current is None:
        # The user left that team (or it was deleted): fall back to all teams.
        request.session.pop(SESSION_KEY, None)
    scope = Scope(teams=teams, current=current,
                  writable_ids=frozenset(core_selectors.writable_team_ids(request.user)))
    request._dlopt_scope = scope
    return scope


def set_current_team(request: HttpRequest, team_id: int | None) -> bool:
    """Pick a team (None = all my teams). False when the team is not one of the user's."""
    if team_id is None:
        request.session.pop(SESSION_KEY, None)
    else:
        if not core_selectors.teams_for_user(request.user).filter(pk=team_id).exists():
            return False
        request.session[SESSION_KEY] = team_id
    if hasattr(request, "_dlopt_scope"):
        del request._dlopt_scope
    return True

"""Team-scoped permissions: viewers read, members write, owners manage members."""
from rest_framework import permissions

from core.models import Membership


def _role(request, team_id) -> str | None:
    cache = request.__dict__.setdefault("_team_roles", {})
    if team_id not in cache:
        cache[team_id] = (
            Membership.objects.filter(user=request.user, team_id=team_id).values_list("role", flat=True).first()
        )
    return cache[team_id]


class IsTeamMemberWriteOrReadOnly(permissions.BasePermission):
    """Object-level: any member reads; owners and members write; viewers are refused (403)."""

    message = "Viewers have read-only access to this team."

    def has_object_permission(self, request, view, obj):
        team_id = getattr(obj, "team_id", None)
        role = _role(request, team_id)
        if role is None:
            return bool(request.user.is_staff and request.method in permissions.SAFE_METHODS)
        if request.method in permissions.SAFE_METHODS:
            return True
        return role in (Membership.Role.OWNER, Membership.Role.MEMBER)


class IsStaffOrReadOnly(permissions.BasePermission):
    message = "Only staff can change this."

    def has_permission(self, request, view):
        return request.method in permissions.SAFE_METHODS or bool(request.user and request.user.is_staff)

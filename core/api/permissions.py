"""Team-scoped permissions: viewers read, members write, owners manage members."""
from django.conf import settings
from django.db.models import OuterRef, QuerySet, Subquery
from rest_framework import permissions

from core.models import Membership

CALLER_ROLE = "caller_team_role"
_UNSET = object()


def with_caller_role(queryset: QuerySet, user) -> QuerySet:
    """Annotate each row with `user`'s role in the row's team, so the object permission needs no query."""
    role = Membership.objects.filter(team_id=OuterRef("team_id"), user_id=user.pk).values("role")[:1]
    return queryset.annotate(**{CALLER_ROLE: Subquery(role)})


def _role(request, team_id, obj=None) -> str | None:
    cache = request.__dict__.setdefault("_team_roles", {})
    if team_id not in cache:
        # Annotated for request.user by with_caller_role in this request's queryset.
        annotated = obj.__dict__.get(CALLER_ROLE, _UNSET) if obj is not None else _UNSET
        cache[team_id] = annotated if annotated is not _UNSET else (
            Membership.objects.filter(user=request.user, team_id=team_id).values_list("role", flat=True).first()
        )
    return cache[team_id]


class IsTeamMemberWriteOrReadOnly(permissions.BasePermission):
    """Object-level: any member reads; owners and members write; viewers are refused (403)."""

    message = "Viewers have read-only access to this team."

    def has_object_permission(self, request, view, obj):
        team_id = getattr(obj, "team_id", None)
        role = _role(request, team_id, obj)
        if role is None:
            return bool(request.user.is_staff and request.method in permissions.SAFE_METHODS)
        if request.method in permissions.SAFE_METHODS:
            return True
        return role in (Membership.Role.OWNER, Membership.Role.MEMBER)


class IsStaffOrReadOnly(permissions.BasePermission):
    message = "Only staff can change this."

    def has_permission(self, request, view):
        return request.method in permissions.SAFE_METHODS or bool(request.user and request.user.is_staff)


class ApiDocsAccess(permissions.BasePermission):
    """/api/schema/ and /api/docs/: signed-in users, or anyone when settings.API_DOCS_PUBLIC (read per request)."""

    def has_permission(self, request, view):
        return bool(settings.API_DOCS_PUBLIC or (request.user and request.user.is_authenticated))

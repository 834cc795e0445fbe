"""Writes of the core app, one module per seam: ``teams`` (teams, members), ``invitations``, ``quotas``,
``energy`` (the energy model), ``tokens`` (API tokens), ``webhooks`` (team notifications), ``registry`` (the
DL model registry: upload, archive, restore, staff-only delete), ``usage`` (the append-only usage ledger). Keyword-only,
typed, atomic: views, admin, commands and tasks call them; reads live in ``core.selectors``.

Everything public is re-exported here, so callers write ``from core import services``."""
from .energy import check_energy_value, ensure_energy_settings, update_energy_settings
from .invitations import accept_invitation, decline_invitation, invite_member
from .quotas import QUOTA_FIELDS, lock_team_quota, update_quota
from .registry import (
    archive_model,
    delete_model,
    finish_model_validation,
    read_upload,
    register_model,
    require_ready,
    restore_model,
    submit_model,
    task_counter,
    validate_model_bytes,
)
from .teams import (
    TEAM_FIELDS,
    add_member,
    change_member_role,
    check_role,
    create_team,
    remove_member,
    require_team_creator,
    update_team,
)
from .usage import charge_usage, energy_source_of
from .tokens import IssuedToken, create_api_token, create_api_token_confirmed, revoke_api_token
from .webhooks import (
    WebhookChange,
    notify_terminal,
    remove_team_webhook,
    rotate_webhook_secret,
    set_team_webhook,
)

__all__ = [
    "QUOTA_FIELDS", "TEAM_FIELDS", "IssuedToken", "WebhookChange", "create_api_token_confirmed",
    "notify_terminal", "remove_team_webhook", "rotate_webhook_secret", "set_team_webhook",
    "accept_invitation", "add_member", "archive_model", "change_member_role", "charge_usage", "check_energy_value",
    "check_role", "create_api_token", "create_team", "decline_invitation", "delete_model", "energy_source_of",
    "ensure_energy_settings", "finish_model_validation", "restore_model",
    "invite_member", "lock_team_quota", "read_upload", "register_model", "remove_member", "require_ready",
    "require_team_creator", "revoke_api_token", "submit_model", "task_counter", "update_energy_settings",
    "update_quota", "update_team", "validate_model_bytes",
]

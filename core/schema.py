"""drf-spectacular extensions: document our token authentication, and the error answers of every operation."""
from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "core.authentication.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <key>`; create keys with POST /api/tokens/ and revoke them with DELETE.",
        }


# The one error body of the API (core/api/errors.py), and which operations can answer which status.
ERROR_COMPONENT = "Error"
ERROR_SCHEMA = {
    "type": "object",
    "description": "Every 4xx/5xx answer of the API (core/api/errors.py).",
    "properties": {
        "detail": {"type": "string", "description": "What went wrong, for a person."},
        "code": {"type": "string", "description": "A stable machine-readable code (invalid, not_found, "
                                                  "conflict, quota_exceeded, throttled, ...)."},
        "errors": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}},
                   "description": "Field (or query parameter) name -> messages; empty when no field is at fault."},
        "quota": {"type": "string", "description": "The team quota that refused the request (429 only)."},
    },
    "required": ["detail", "code", "errors"],
}
ERROR_DESCRIPTIONS = {
    "400": "Invalid input: a field or query parameter is wrong or unknown (named in `errors`).",
    "401": "Not authenticated: no valid token or session.",
    "403": "Not allowed: your role in the team does not permit this.",
    "404": "Not found, or not one of your teams' objects.",
    "409": "Conflict with the object's state (for example a run that has already finished).",
    "429": "Too many requests (Retry-After says when to retry), or a team quota is reached (`quota`).",
}
WRITE_METHODS = {"post", "put", "patch", "delete"}


def _error_statuses(path: str, method: str, operation: dict) -> list[str]:
    statuses = ["400", "403", "429"]  # 400: any operation refuses an unknown query parameter (core.api.strict)
    if {} not in (operation.get("security") or [{}]):
        statuses.append("401")
    if "{" in path:
        statuses.append("404")
    if method in WRITE_METHODS and "{" in path:
        statuses.append("409")
    return sorted(statuses)


def add_error_responses(result, generator, request, public):
    """drf-spectacular postprocessing hook: every operation documents the error answers it can give, with
    the one error body (an operation's own description of a status is kept)."""
    result.setdefault("components", {}).setdefault("schemas", {})[ERROR_COMPONENT] = ERROR_SCHEMA
    ref = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if method not in {"get", "head", "options", "trace", *WRITE_METHODS}:
                continue
            responses = operation.setdefault("responses", {})
            for status in _error_statuses(path, method, operation):
                responses.setdefault(status, {"description": ERROR_DESCRIPTIONS[status],
                                              "content": {"application/json": {"schema": ref}}})
    return result

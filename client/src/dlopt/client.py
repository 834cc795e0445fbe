"""`Client`: the platform's REST API over the standard library's urllib.

Methods return the API's JSON objects as dicts (a run, a model, a team), lists of them, or a
`Download`. Every 4xx/5xx raises `ApiError`, whose message is one readable line of the platform's
error body `{"detail", "code", "errors"}`.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.client import HTTPResponse
from pathlib import Path
from typing import Any, cast

from . import __version__
from .config import load
from .errors import ApiError, ConnectionFailed, DloptError, NotFound, UsageError

Json = dict[str, Any]
# A run in one of these states changes no more until someone acts on it: `wait` returns it.
STOPPED_STATES = ("succeeded", "failed", "cancelled", "paused")
PAGE_SIZE = 100


@dataclass(frozen=True)
class Download:
    path: Path
    size: int
    deploy_verdict: str  # the server's X-Deploy-Verdict: which engine is faster on the run's target


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """urllib would replay the Authorization header to wherever a redirect points, another host included:
    the token must only ever go to the URL the user logged in to, so a redirect is an error instead."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        raise ConnectionFailed(f"The server redirected {req.full_url} to {newurl}; the client does not follow "
                               "redirects (they could carry your token elsewhere). Log in with the final URL "
                               "(https://...?).")


def api_root(url: str) -> str:
    """The server's base URL without a trailing slash or /api (users paste either)."""
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"Not a server URL: {url!r} (expected https://host[:port]).")
    path = parsed.path.rstrip("/")
    path = path.removesuffix("/api")
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, "", ""))


class Client:
    """The dlopt API as methods. `url` is the server (https://host), `token` an API token."""

    def __init__(self, url: str, token: str, *, timeout: float = 60.0) -> None:
        self.url = api_root(url)
        self.token = token
        self.timeout = timeout
        self._opener = urllib.request.build_opener(_NoRedirect)

    @classmethod
    def from_config(cls, *, timeout: float = 60.0) -> Client:
        """The client `dlopt login` set up (DLOPT_URL / DLOPT_TOKEN override the saved file)."""
        credentials = load()
        return cls(credentials.url, credentials.token, timeout=timeout)

    # --- transport ------------------------------------------------------------------------------------

    def _open(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: bytes | None = None,
              content_type: str | None = None) -> HTTPResponse:
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
        url = f"{self.url}/api/{path.lstrip('/')}" + (f"?{query}" if query else "")
        request = urllib.request.Request(url, data=body, method=method)
        request.add_header("Authorization", f"Token {self.token}")
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", f"dlopt-client/{__version__}")
        if content_type:
            request.add_header("Content-Type", content_type)
        try:
            return cast(HTTPResponse, self._opener.open(request, timeout=self.timeout))
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                payload = json.loads(raw) if raw else {}
            except ValueError:  # a proxy's HTML page, not the platform
                payload = {}
            raise ApiError(exc.code, payload, reason=f"HTTP {exc.code} {exc.reason} from {url}") from None
        except urllib.error.URLError as exc:
            raise ConnectionFailed(f"Cannot reach {self.url}: {exc.reason}") from None
        except OSError as exc:  # timeouts, resets
            raise ConnectionFailed(f"Cannot reach {self.url}: {exc}") from None

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                json_body: Any = None) -> Any:
        """One API call; the decoded JSON answer (None for an empty one)."""
        body = json.dumps(json_body).encode() if json_body is not None else None
        with self._open(method, path, params=params, body=body,
                        content_type="application/json" if body is not None else None) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def _object(self, method: str, path: str, **kwargs: Any) -> Json:
        data = self.request(method, path, **kwargs)
        if not isinstance(data, dict):
            raise DloptError(f"Unexpected answer from {self.url}/api/{path}: not a JSON object.")
        return data

    def _pages(self, path: str, params: dict[str, Any], limit: int | None) -> list[Json]:
        rows: list[Json] = []
        page = 1
        while limit is None or len(rows) < limit:
            data = self.request("GET", path, params={**params, "page": page, "page_size": PAGE_SIZE})
            rows.extend(data["results"])
            if not data.get("next"):
                break
            page += 1
        return rows if limit is None else rows[:limit]

    # --- account and teams ----------------------------------------------------------------------------

    def me(self) -> Json:
        """The caller: id, username, is_staff, teams [{id, slug, name, role}]."""
        return self._object("GET", "me/")

    def teams(self) -> list[Json]:
        return self._pages("teams/", {}, None)

    def team_id(self, team: str | int) -> int:
        """A team's id from its id, slug or name (the API takes ids and slugs; names are resolved here)."""
        teams = self.teams()
        ref = str(team).strip()
        for key in ("id", "slug", "name"):
            for row in teams:
                if str(row[key]) == ref:
                    return int(row["id"])
        names = ", ".join(row["slug"] for row in teams) or "none"
        raise NotFound(f"No team '{ref}' among yours (yours: {names}).")

    # --- models ---------------------------------------------------------------------------------------

    def upload_model(self, path: str | os.PathLike[str], *, team: str | int, name: str | None = None,
                     description: str = "") -> Json:
        """Upload an ONNX file. A small file is validated in the request (state `ready`); a large one
        comes back `validating`: `wait_model` follows it."""
        file = Path(path)
        if not file.is_file():
            raise UsageError(f"No such file: {file}")
        fields = {"team": str(self.team_id(team)), "name": name or file.stem, "description": description}
        body, content_type = _multipart(fields, "file", file.name, file.read_bytes())
        with self._open("POST", "models/", body=body, content_type=content_type) as response:
            answer = json.loads(response.read())
        if not isinstance(answer, dict):
            raise DloptError(f"Unexpected answer from {self.url}/api/models/: not a JSON object.")
        return answer

    def models(self, *, team: str | int | None = None, name: str | None = None,
               limit: int | None = None) -> list[Json]:
        params = {"team": self.team_id(team) if team is not None else None, "name": name}
        return self._pages("models/", params, limit)

    def model(self, ref: str | int, *, team: str | int | None = None) -> Json:
        """A model by id, or by exact name (with `team` where two of your teams use the name)."""
        ref = str(ref).strip()
        if ref.isdigit():
            return self._object("GET", f"models/{ref}/")
        matches = [m for m in self.models(team=team, name=ref) if m["name"] == ref]
        if not matches:
            raise NotFound(f"No model '{ref}'" + (f" in team {team}" if team is not None else " in your teams") + ".")
        if len(matches) > 1:
            teams = ", ".join(str(m.get("team_name") or m["team"]) for m in matches)
            raise UsageError(f"Model '{ref}' exists in several of your teams ({teams}): pass --team.")
        return matches[0]

    def wait_model(self, model_id: int, *, interval: float = 2.0) -> Json:
        """Poll a model until its validation ends (`ready` or `invalid`)."""
        while True:
            model = self._object("GET", f"models/{model_id}/")
            if model["state"] != "validating":
                return model
            time.sleep(interval)

    # --- runs -----------------------------------------------------------------------------------------

    def tune(self, model: str | int, *, trials: int, minutes: int | None = None, team: str | int | None = None,
             trials_per_round: int | None = None, target: Json | None = None, mode: str | None = None,
             dop: str | int | None = None, threads: int | None = None, seed: int | None = None,
             trimmer: bool = False, trimmer_options: Json | None = None) -> Json:
        """Start a tuning run of a model (id or name); the queued run. ``minutes``: a time budget beside the
        trials (tuning finishes at whichever is spent first)."""
        model_id = int(model) if str(model).isdigit() else self.model(model, team=team)["id"]
        body: Json = {"model": model_id, "max_trials": trials, "trimmer": trimmer}
        optional = {"max_minutes": minutes, "trials_per_round": trials_per_round, "target": target,
                    "measurement_mode": mode,
                    "dop": None if dop is None else str(dop), "threads": threads, "seed": seed,
                    "trimmer_options": trimmer_options}
        body.update({k: v for k, v in optional.items() if v is not None})
        return self._object("POST", "runs/", json_body=body)

    def runs(self, *, team: str | int | None = None, model: str | int | None = None, status: str | None = None,
             limit: int | None = 50) -> list[Json]:
        """Runs of your teams, newest first."""
        model_id = None if model is None else (
            int(model) if str(model).isdigit() else self.model(model, team=team)["id"])
        params = {"team": self.team_id(team) if team is not None else None, "model": model_id, "status": status,
                  "ordering": "-created_at"}
        return self._pages("runs/", params, limit)

    def run(self, run_id: int) -> Json:
        return self._object("GET", f"runs/{int(run_id)}/")

    def tasks(self, run_id: int) -> list[Json]:
        return self._pages(f"runs/{int(run_id)}/tasks/", {}, None)

    def pause(self, run_id: int) -> Json:
        return self._object("POST", f"runs/{int(run_id)}/pause/")

    def resume(self, run_id: int) -> Json:
        return self._object("POST", f"runs/{int(run_id)}/resume/")

    def cancel(self, run_id: int) -> Json:
        return self._object("POST", f"runs/{int(run_id)}/cancel/")

    def compare(self, run_ids: list[int]) -> list[Json]:
        return [self.run(run_id) for run_id in run_ids]

    def follow(self, run_id: int, *, interval: float = 2.0) -> Iterator[Json]:
        """The run as each poll sees it, until it stops (succeeded, failed, cancelled or paused)."""
        while True:
            run = self.run(run_id)
            yield run
            if run["status"] in STOPPED_STATES:
                return
            time.sleep(interval)

    def wait(self, run_id: int, *, interval: float = 2.0, on_update: Callable[[Json], object] | None = None) -> Json:
        """Poll until the run stops; the run as it stopped (check its `status`: paused and cancelled
        runs stop too)."""
        run: Json = {}
        for run in self.follow(run_id, interval=interval):
            if on_update is not None:
                on_update(run)
        return run

    def download(self, run_id: int, path: str | os.PathLike[str] | None = None, *,
                 overwrite: bool = False, module_only: bool = False) -> Download:
        """Save the run's deployment package (GET /api/runs/{id}/package/: the module, manifest.json and
        run.py in a zip) to `path` (default ./run{id}-package.zip), or with `module_only` the bare compiled
        module (GET /api/runs/{id}/module/, default ./run{id}-tuned.so). The server's file name is never
        used as a path."""
        name, endpoint = ((f"run{int(run_id)}-tuned.so", "module") if module_only
                          else (f"run{int(run_id)}-package.zip", "package"))
        target = Path(path) if path is not None else Path(name)
        if target.is_dir():
            target = target / name
        if not target.parent.is_dir():
            raise UsageError(f"No such directory: {target.parent}")
        if target.exists() and not overwrite:
            raise UsageError(f"{target} exists: pass --force to overwrite it.")
        with self._open("GET", f"runs/{int(run_id)}/{endpoint}/") as response:
            verdict = response.headers.get("X-Deploy-Verdict", "")
            size = 0
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
            try:
                with os.fdopen(fd, "wb") as out:
                    while chunk := response.read(1 << 20):
                        out.write(chunk)
                        size += len(chunk)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return Download(path=target, size=size, deploy_verdict=verdict)


def _multipart(fields: dict[str, str], file_field: str, filename: str, data: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    safe_name = filename.replace('"', "_").replace("\r", "_").replace("\n", "_")
    chunks: list[bytes] = []
    for key, value in fields.items():
        chunks.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n'.encode())
        chunks.append(value.encode() + b"\r\n")
    chunks.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{file_field}"; filename="{safe_name}"\r\n'
                  "Content-Type: application/octet-stream\r\n\r\n".encode())
    chunks.extend([data, f"\r\n--{boundary}--\r\n".encode()])
    return b"".join(chunks), f"multipart/form-data; boundary={boundary}"

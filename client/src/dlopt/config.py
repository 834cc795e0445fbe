"""Where the CLI keeps the server URL and API token: ~/.config/dlopt/config.json, readable by its owner only.

DLOPT_URL and DLOPT_TOKEN override what is stored (CI jobs, one-off calls against another server).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import NotLoggedIn


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "dlopt" / "config.json"


def save(credentials: Credentials, path: Path | None = None) -> Path:
    """Write the file with mode 0600 from its creation (never world-readable, even for an instant)."""
    path = path or config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"url": credentials.url, "token": credentials.token}, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    os.chmod(path, 0o600)  # an older file kept its mode through os.replace on some filesystems
    return path


def load(path: Path | None = None) -> Credentials:
    """The stored URL and token, each overridden by DLOPT_URL / DLOPT_TOKEN when set."""
    path = path or config_path()
    stored: dict[str, Any] = {}
    if path.exists():
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise NotLoggedIn(f"Cannot read {path} ({exc}): run `dlopt login` again.") from None
    url = os.environ.get("DLOPT_URL") or stored.get("url") or ""
    token = os.environ.get("DLOPT_TOKEN") or stored.get("token") or ""
    if not url or not token:
        missing = "server URL" if not url else "API token"
        raise NotLoggedIn(f"Not logged in (no {missing}): run `dlopt login URL` (or set DLOPT_URL and DLOPT_TOKEN).")
    return Credentials(url=url, token=token)

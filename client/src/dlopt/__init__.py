"""dlopt: command line and Python client of the dlopt platform (standard library only).

    from dlopt import Client
    client = Client("https://dlopt.example.com", token)
    run = client.wait(client.tune("resnet18", trials=256, team="vision")["id"])
"""
from __future__ import annotations

__version__ = "0.1.0"

from .client import STOPPED_STATES, Client, Download
from .errors import (
    ApiError,
    ConnectionFailed,
    DloptError,
    NotFound,
    NotLoggedIn,
    UsageError,
)

__all__ = ["STOPPED_STATES", "ApiError", "Client", "ConnectionFailed", "DloptError", "Download", "NotFound",
           "NotLoggedIn", "UsageError", "__version__"]

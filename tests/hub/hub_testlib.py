"""Helpers to write small registries for the hub tests."""

from __future__ import annotations

import hashlib

REVISION = "0123456789abcdef0123456789abcdef01234567"


def file_entry(name: str, body: bytes) -> dict:
    return {"name": name, "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}


def registry_data(name: str, files: list[dict], sources: list[dict]) -> dict:
    return {"schema": 1, "models": [{
        "name": name, "description": "test model", "kind": "test-input", "license": "MIT",
        "browser": False, "files": files, "sources": sources}]}

"""A `file:` API key is read only from the secret roots (the toolkit's and those the inventory declares), once every
symbolic link is followed, never a system file, never past a cap, never blocking on a pipe."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolkit.adapters.ansible import InventoryHost
from toolkit.app.apply import MAX_KEY_FILE_BYTES, _api_key, secret_roots
from toolkit.core.errors import ToolkitError


def test_the_key_is_read_from_a_declared_root(tmp_path: Path) -> None:
    key = tmp_path / "keys" / "api-key"
    key.parent.mkdir()
    key.write_text("k-123\n")
    roots = secret_roots({"ct": InventoryHost("ct", ("gpu_containers",), {"toolkit_secret_roots": [str(key.parent)]})})
    assert str(key.parent) + "/" in roots and "/etc/sglang/" in roots
    assert _api_key(f"file:{key}", roots) == ({"sglang_service_api_key": "k-123"}, {})


def test_a_system_directory_is_never_a_declared_root() -> None:
    hosts = {"ct": InventoryHost("ct", (), {"toolkit_secret_roots": ["/etc", "/", "/root/.ssh", "/etc/../etc"]})}
    assert secret_roots(hosts) == ("/etc/sglang/", "/run/secrets/", "/run/credentials/")


@pytest.mark.parametrize("make", ["outside", "link-out", "fifo", "huge"])
def test_refused_and_never_read(tmp_path: Path, make: str) -> None:
    root = tmp_path / "keys"
    root.mkdir()
    path = root / "api-key"
    if make == "outside":
        path = tmp_path / "elsewhere"
        path.write_text("k")
    elif make == "link-out":
        os.symlink("/etc/hostname", path)
    elif make == "fifo":
        os.mkfifo(path)
    else:
        with path.open("wb") as handle:
            handle.truncate(1024**3)
    with pytest.raises(ToolkitError) as err:
        _api_key(f"file:{path}", (str(root) + "/",))
    (problem,) = err.value.problems
    assert problem.field == "server.api_key_secret"
    assert {"outside": "outside the secret roots", "link-out": "outside the secret roots",
            "fifo": "named pipe", "huge": f"{MAX_KEY_FILE_BYTES + 1:,} bytes or more"}[make] in problem.message

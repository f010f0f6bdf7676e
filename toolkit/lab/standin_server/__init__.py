"""The lab's stand-in for SGLang's HTTP server (see server.py: standard library only, copied into the container)."""

from __future__ import annotations

from pathlib import Path

SERVER_PATH = Path(__file__).with_name("server.py")

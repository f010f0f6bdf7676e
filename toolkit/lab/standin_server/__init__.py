"""The lab's stand-in for SGLang's HTTP server (see server.py: standard library only, copied into the container)."""

from __future__ import annotations

from pathlib import Path

SERVER_PATH = Path(__file__).with_name("server.py")

# The benchmark client the lab runs when the pinned release's own cannot start there. From 0.5.10 on,
# `python -m sglang.bench_serving` imports torch (sglang/__init__.py and sglang.srt modules the client takes a
# constant from), and the lab's containers have no torch: PyPI's is the CUDA build, 4.4 GB with its NVIDIA
# libraries, and it does not import without them. 0.5.9's client imports without it (each release's tried in a
# torch-less venv with the wheelhouse's packages), speaks the same OpenAI HTTP API and takes every flag the
# toolkit renders (tests/profile/test_profile_catalogue.py checks them against 0.5.9's and 0.5.23's). Announced in
# the lab's notes; real hosts always run their own release's client.
LAB_BENCH_CLIENT_RELEASE = "0.5.9"
LAB_BENCH_CLIENT_DIR = f"/opt/sglang/standin/bench-client-{LAB_BENCH_CLIENT_RELEASE}"

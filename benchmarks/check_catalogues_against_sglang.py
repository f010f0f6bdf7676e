"""Each shipped flag catalogue against the release's own parser, and renders parsed by it.

    python3 benchmarks/check_catalogues_against_sglang.py --setup /var/cache/toolkit/sglang-parser-env
    python3 benchmarks/check_catalogues_against_sglang.py --env /var/cache/toolkit/sglang-parser-env \
        [--releases 0.5.9 0.5.23] [--parse glm5-tp8@0.5.23 glm5-tp8-0.5.23@0.5.23] [--profiles-dir DIR] [--json OUT]

The catalogues are read statically from each release's wheel (toolkit/core/profile/catalogue.py). This script
imports the release itself: its `sglang` package from the cached wheel (no install, no compiled parts) on a CPU
machine, `ServerArgs.add_cli_args(argparse.ArgumentParser())`, then the walk over `parser._actions`. It compares
the two flag for flag (names, registration order, action, nargs, type, required, deprecation and replacement: they
must agree; choices and defaults computed at run time are listed), and runs profile renders through
`parser.parse_args` of the release they name: `NAME@VERSION` parses the launch argv `toolkit profile render NAME`
gives, under VERSION's parser.

Too heavy for CI: importing server_args pulls torch, transformers and friends. `--setup DIR` builds that
environment once (a venv of about 6 GB: CUDA torch from PyPI imports fine without a GPU), and per transformers pin
of the releases a directory put in front of it (each release imports the transformers it was built against).
Prints one JSON object; exit 1 when a catalogue disagrees with its release or a parse result is not the expected one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from toolkit.adapters import sglang_catalogue  # noqa: E402
from toolkit.adapters.profile_store import ProfileStore  # noqa: E402
from toolkit.core.profile.render import render_launch_argv  # noqa: E402

# What server_args.py and its imports need on a CPU machine, found by importing every release from 0.5.9 to 0.5.23
# (kernels: sglang pins <0.15 and newer ones break the transformers of 0.5.11-0.5.19; torchvision without deps keeps
# the torch that came first).
ENV_PACKAGES = ["msgspec", "numpy", "orjson", "psutil", "pybase64", "requests", "torch", "packaging", "pillow",
                "starlette", "pydantic", "pyzmq", "tqdm", "ipython", "aiohttp", "safetensors", "openai",
                "partial_json_parser", "huggingface_hub", "transformers", "dill", "sentencepiece", "xgrammar", "httpx",
                "kernels<0.15,>=0.14.1", "pyyaml"]
AGREE = ("names", "dest", "action", "nargs", "type", "required", "deprecated", "replacement")

WALK = r"""
import argparse, contextlib, io, json, sys
sys.path[0:0] = json.loads(sys.argv[1])
from sglang.srt.server_args import ServerArgs
sys.path.insert(0, sys.argv[2])
from toolkit.core.profile.catalogue import extract_from_parser
parser = argparse.ArgumentParser(prog="sglang")
ServerArgs.add_cli_args(parser)
parses = []
for argv in json.loads(sys.stdin.read()):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv)
        parses.append({"ok": True, "error": ""})
    except SystemExit as exit:
        lines = err.getvalue().strip().splitlines()
        parses.append({"ok": exit.code == 0, "error": lines[-1] if lines else ""})
print(json.dumps({"flags": [f.to_json() for f in extract_from_parser(parser)], "parses": parses}))
"""


def _requires_pin(wheel: Path, name: str) -> str | None:
    for req in sglang_catalogue.wheel_requires(wheel):
        if req.startswith(f"{name}=="):
            return req.split("==", 1)[1].split(";", 1)[0].strip()
    return None


def setup(env: Path, releases: list[str]) -> None:
    python = env / "venv" / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(env / "venv")], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *ENV_PACKAGES], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "torchvision"], check=True)
    for version in releases:
        pin = _requires_pin(sglang_catalogue.ensure_wheel(version), "transformers")
        target = env / f"transformers-{pin}"
        if pin and not target.exists():
            subprocess.run([str(python), "-m", "pip", "install", "-q", "--target", str(target),
                            f"transformers=={pin}"], check=True)


def walk(env: Path, version: str, argvs: list[list[str]]) -> dict:
    wheel = sglang_catalogue.ensure_wheel(version)
    pin = _requires_pin(wheel, "transformers")
    with tempfile.TemporaryDirectory(prefix=f"sglang-{version}-") as tmp:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tmp, [n for n in zf.namelist() if n.startswith("sglang/") and not n.endswith(".so")])
        paths = [tmp] + ([str(env / f"transformers-{pin}")] if (env / f"transformers-{pin}").exists() else [])
        proc = subprocess.run([str(env / "venv" / "bin" / "python"), "-c", WALK, json.dumps(paths), str(REPO)],
                              input=json.dumps(argvs), capture_output=True, text=True, cwd=tmp)
    if proc.returncode != 0:
        raise SystemExit(f"SGLang {version} did not import: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(static: list[dict], runtime: list[dict]) -> dict:
    by_name = {f["names"][0]: f for f in static}
    order_static = [f["names"][0] for f in static]
    order_runtime = [f["names"][0] for f in runtime]
    disagree: list[str] = []
    only_runtime_choices: list[str] = []
    defaults: list[str] = []
    for f in runtime:
        s = by_name.get(f["names"][0])
        if s is None:
            continue
        for key in AGREE:
            a, b = s[key], f[key]
            if key == "names":
                a, b = sorted(a), sorted(b)
            if a != b:
                disagree.append(f"{f['names'][0]} {key}: static {a!r}, runtime {b!r}")
        if s["choices"] is None and f["choices"] is not None:
            only_runtime_choices.append(f["names"][0])
        elif s["choices"] is not None and sorted(map(str, s["choices"])) != sorted(map(str, f["choices"] or [])):
            disagree.append(f"{f['names'][0]} choices: static {s['choices']}, runtime {f['choices']}")
        if s["default"] != f["default"]:
            defaults.append(f["names"][0])
    return {
        "flags_static": len(static),
        "flags_runtime": len(runtime),
        "only_static": sorted(set(order_static) - set(order_runtime)),
        "only_runtime": sorted(set(order_runtime) - set(order_static)),
        "same_order": order_static == order_runtime,
        "disagree": disagree,
        "choices_only_at_run_time": only_runtime_choices,
        "defaults_differ": defaults,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setup", type=Path, metavar="DIR", help="build the import environment in DIR, then stop")
    ap.add_argument("--env", type=Path, metavar="DIR", help="the environment --setup built")
    ap.add_argument("--releases", nargs="*", default=None, help="default: every shipped catalogue")
    ap.add_argument("--parse", nargs="*", default=["glm5-tp8@0.5.9", "glm5-tp8@0.5.23", "glm5-tp8-0.5.23@0.5.23"],
                    metavar="NAME@VERSION")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the result here")
    ap.add_argument("--profiles-dir", type=Path, default=REPO / "profiles",
                    help="where the --parse profiles are (e.g. a copy after `toolkit profile migrate ... --write`)")
    args = ap.parse_args()
    releases = args.releases or sglang_catalogue.available_versions()
    if args.setup:
        setup(args.setup, releases)
        return 0
    if args.env is None:
        ap.error("give --env DIR (built with --setup DIR)")
    profiles = ProfileStore(args.profiles_dir)
    wanted: dict[str, list[tuple[str, list[str]]]] = {}
    for item in args.parse:
        name, _, version = item.partition("@")
        wanted.setdefault(version, []).append((name, render_launch_argv(profiles.resolve(name))[3:]))
    releases_out: dict[str, object] = {}
    parses_out: list[dict[str, object]] = []
    out: dict[str, object] = {"releases": releases_out, "parses": parses_out}
    ok = True
    for version in sorted(set(releases) | set(wanted), key=sglang_catalogue.release_key):
        argvs = wanted.get(version, [])
        result = walk(args.env, version, [a for _, a in argvs])
        catalogue = sglang_catalogue.load_catalogue(version)
        if catalogue is not None and version in releases:
            row = compare([f.to_json() for f in catalogue.flags], result["flags"])
            ok &= not (row["only_static"] or row["only_runtime"] or row["disagree"] or not row["same_order"])
            releases_out[version] = row
            print(f"{version}: {row['flags_static']} static / {row['flags_runtime']} runtime flags, "
                  f"{len(row['disagree'])} disagreements, same order {row['same_order']}, choices only at run time: "
                  f"{', '.join(row['choices_only_at_run_time']) or 'none'}", file=sys.stderr)
        for (name, _argv), parsed in zip(argvs, result["parses"], strict=True):
            parses_out.append({"profile": name, "release": version, **parsed})
            print(f"{name} under SGLang {version}'s parser: {'parses' if parsed['ok'] else parsed['error']}",
                  file=sys.stderr)
            pinned = profiles.resolve(name).spec.engine.sglang_version
            ok &= parsed["ok"] == (pinned == version)  # a render parses under its own release, not under another
    text = json.dumps(out, indent=1, sort_keys=True)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Hostile profiles by class, built in a folder (files that git cannot hold: FIFOs, links, sparse files, a file
name with an escape in it): the inputs of test_profile_hostile.py, its resource-capped run, and the benchmark.

Each case is a profile to validate (`toolkit profile validate NAME --profiles-dir DIR`) with what its refusal must
say; `build(folder)` writes every case's files into `folder/profiles` beside the base profile they extend.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BASE = """\
schema_version: 1
name: ok-base
description: valid base of the hostile cases
target:
  gpu_model: NVIDIA H200
  gpu_count: 8
  compute_capability: SM90
  interconnect: nvlink
  p2p: true
engine:
  sglang_version: 0.5.9
model:
  repo_id: Qwen/Qwen3-8B
server:
  tp_size: 8
"""

# A file outside the profiles directory whose content must never be parsed or printed.
OUTSIDE_SECRET = "OUTSIDE-CONTENT-NEVER-SHOWN"
TARGET = "sglang/srt/model_executor/model_runner.py"


@dataclass(frozen=True)
class Case:
    name: str  # the profile validated
    klass: str  # the class it stands for
    says: str  # a piece of the first error's message or fix
    setup: Callable[[Path], None]  # writes its files into the profiles directory
    never: tuple[str, ...] = ()  # text that must appear in no output
    located: bool = True  # the error names a file


def _child(name: str, body: str, extends: str = "ok-base") -> Callable[[Path], None]:
    def write(d: Path) -> None:
        (d / f"{name}.yaml").write_text(f"schema_version: 1\nname: {name}\nextends: {extends}\n{body}")

    return write


def _fifo(d: Path) -> None:
    os.mkfifo(d / "fifo-profile.yaml")


def _fifo_parent(d: Path) -> None:
    os.mkfifo(d / "fifo-parent.yaml")
    _child("extends-fifo", "", "fifo-parent")(d)


def _directory(d: Path) -> None:
    (d / "dir-profile.yaml").mkdir()


def _loop(d: Path) -> None:
    os.symlink("loop-b.yaml", d / "loop-a.yaml")
    os.symlink("loop-a.yaml", d / "loop-b.yaml")
    _child("extends-loop", "", "loop-a")(d)


def _outside(d: Path) -> None:
    outside = d.parent / "outside.yaml"
    outside.write_text(f"schema_version: 1\nname: link-out\ndescription: {OUTSIDE_SECRET}\n")
    os.symlink(outside, d / "link-out.yaml")


def _outside_parent(d: Path) -> None:
    outside = d.parent / "outside-parent.yaml"
    outside.write_text(f"schema_version: 1\nname: parent-out\ndescription: {OUTSIDE_SECRET}\n")
    os.symlink(outside, d / "parent-out.yaml")
    _child("extends-link-out", "", "parent-out")(d)


def _dev_zero(d: Path) -> None:
    os.symlink("/dev/zero", d / "dev-zero.yaml")


def _deep(d: Path) -> None:
    for i in range(40):
        _child(f"deep-{i}", "", f"deep-{i + 1}" if i < 39 else "ok-base")(d)


def _heavy(d: Path) -> None:
    # Each file within the per-file cap (512 KiB); together more than a chain may hold.
    text = "x" * (400 * 1024)
    for i in range(4):
        _child(f"heavy-{i}", f"description: {text}\n", f"heavy-{i + 1}" if i < 3 else "ok-base")(d)


def _crowd(d: Path) -> None:
    for i in range(3000):
        (d / f"crowd-{i:05d}.yaml").write_text("")
    _child("extends-missing-in-crowd", "", "crowd-missing")(d)


def _patch_entry(name: str, patch: str) -> str:
    return (f"engine:\n  patches:\n    - name: {name}\n      target: {TARGET}\n      target_sha256: {'a' * 64}\n"
            f"      patch: profiles/patches/{patch}\n      reason: a fix\n      link: https://example.org/fix\n")


def _patch_case(name: str, text: str | None) -> Callable[[Path], None]:
    def write(d: Path) -> None:
        (d / "patches").mkdir(exist_ok=True)
        path = d / "patches" / f"{name}.patch"
        if text is None:  # a sparse file of 1 GiB
            with path.open("wb") as handle:
                handle.truncate(1024 ** 3)
        else:
            path.write_text(text)
        _child(name, _patch_entry(name, f"{name}.patch"))(d)

    return write


def _patch_loop(d: Path) -> None:
    (d / "patches").mkdir(exist_ok=True)
    os.symlink("loop.patch", d / "patches" / "loop.patch")
    _child("patch-link-loop", _patch_entry("patch-link-loop", "loop.patch"))(d)


_HUNK = "@@ -1,1 +1,1 @@\n-old\n+new\n"
_SECTION = f"--- a/{TARGET}\n+++ b/{TARGET}\n{_HUNK}"


def _control_file_name(d: Path) -> None:
    (d / "evil\x1b[2K\rok   fine\n.yaml").write_text("schema_version: 1\nname: evil\n")


def cases() -> list[Case]:
    """Every hostile case, must-refuse, by class."""
    long_name = "a" * 300
    return [
        # Bounded work
        Case("long-extends", "bounded", "at most 250 characters", _child("long-extends", "", long_name)),
        Case("long-extends-path", "bounded", "at most 250 characters", _child("long-extends-path", "",
                                                                            "a/" * 3000 + "b")),
        Case(long_name, "bounded", "longer than 250 characters", lambda d: None, located=False),
        Case("huge-int", "bounded", "a whole number of 5,000 characters",
             _child("huge-int", "server:\n  tp_size: " + "9" * 5000 + "\n")),
        Case("huge-int-in-results", "bounded", "a whole number of 4,400 characters",
             _child("huge-int-in-results", "# --- results: written by toolkit, do not edit below this line ---\n"
                    "results:\n  entries:\n    - x: " + "1" * 4400 + "\n")),
        Case("fifo-profile", "bounded", "named pipe", _fifo),
        Case("extends-fifo", "bounded", "named pipe", _fifo_parent),
        Case("dir-profile", "bounded", "directory", _directory),
        Case("extends-loop", "bounded", "symbolic link loop", _loop),
        Case("dev-zero", "bounded", "symbolic link out of the profiles directory", _dev_zero),
        Case("deep-0", "bounded", "more than 16 profiles deep", _deep),
        Case("heavy-0", "bounded", "more than a chain may", _heavy),
        Case("extends-missing-in-crowd", "bounded", "profiles there (`toolkit profile list`)", _crowd),
        Case("many-unknown-keys", "bounded", "more problems of this file are not shown",
             _child("many-unknown-keys", "server:\n" + "".join(f"  k{i}: 1\n" for i in range(2000)))),
        Case("many-extra-args", "bounded", "at most 256 items",
             _child("many-extra-args", "server:\n  extra_args:\n" + "".join(f"    - --x{i}\n" for i in range(2000)))),
        Case("many-values", "bounded", "more than 20,000 values",
             _child("many-values", "why:\n" + "".join(f"  server.k{i}: {{reason: r}}\n" for i in range(12000)))),
        Case("sparse-patch", "bounded", "more than a patch may be", _patch_case("sparse-patch", None)),
        # Nothing leaves its place, nothing is echoed
        Case("link-out", "confined", "symbolic link out of the profiles directory", _outside,
             never=(OUTSIDE_SECRET,)),
        Case("extends-link-out", "confined", "symbolic link out of the profiles directory", _outside_parent,
             never=(OUTSIDE_SECRET,)),
        Case("secret-shadow", "confined", "/etc/sglang/",
             _child("secret-shadow", "server:\n  api_key_secret: file:/etc/shadow\n")),
        Case("secret-proc", "confined", "/etc/sglang/",
             _child("secret-proc", "server:\n  api_key_secret: file:/proc/self/environ\n")),
        Case("local-path-etc", "confined", "/models/",
             _child("local-path-etc", "model:\n  local_path: /etc\n")),
        Case("url-credentials", "redacted", "HOST:PORT",
             _child("url-credentials", "server:\n  dist_init_addr: http://admin:hunter2pass@10.0.0.1:5000\n"),
             never=("hunter2pass",)),
        Case("literal-key", "redacted", "reference",
             _child("literal-key", "server:\n  api_key_secret: hunter2hunter2\n"), never=("hunter2hunter2",)),
        Case("secret-env-not-text", "redacted", "valid string",
             _child("secret-env-not-text", "env:\n  HF_TOKEN: 1234567890123\n"), never=("1234567890123",)),
        Case("evil\x1b[2K\rok   fine\n", "escaped", "not a profile name", _control_file_name, located=False,
             never=("\x1b", "\rok")),
        Case("escape-in-extends", "escaped", "Text not of the form",
             _child("escape-in-extends", "", '"ok\\e[2Kbase"'), never=("\x1b",)),
        # Patches touch only their target
        Case("patch-two-files", "patch", "not " + TARGET,
             _patch_case("patch-two-files", _SECTION + f"--- a/sglang/other.py\n+++ b/sglang/other.py\n{_HUNK}")),
        Case("patch-git-rename", "patch", "a git rename",
             _patch_case("patch-git-rename", f"diff --git a/{TARGET} b/{TARGET}\nrename from x\nrename to y\n")),
        Case("patch-context-diff", "patch", "a context diff",
             _patch_case("patch-context-diff", _SECTION + "*** a/x.py\n--- b/x.py\n***************\n")),
        Case("patch-ed-script", "patch", "ed script", _patch_case("patch-ed-script", _SECTION + "1d\n")),
        Case("patch-creates-file", "patch", "creates or deletes",
             _patch_case("patch-creates-file", f"--- /dev/null\n+++ b/{TARGET}\n@@ -0,0 +1,1 @@\n+x\n")),
        Case("patch-link-loop", "patch", "symbolic link loop", _patch_loop),
        Case("patch-long-path", "patch", "does not exist",
             _child("patch-long-path", _patch_entry("long", "p" * 5000 + ".patch"))),
        # Rules that know the model
        Case("tp-on-heads", "model", "attention heads",
             _child("tp-on-heads", "target:\n  gpu_count: 3\nserver:\n  tp_size: 3\nmodel:\n  config:\n"
                    "    num_attention_heads: 64\n    num_key_value_heads: 64\n    num_hidden_layers: 78\n")),
        Case("ep-on-experts", "model", "experts",
             _child("ep-on-experts", "server:\n  ep_size: 8\nmodel:\n  config:\n    num_attention_heads: 64\n"
                    "    num_key_value_heads: 8\n    num_hidden_layers: 78\n    n_routed_experts: 100\n")),
    ]


def link_locks(d: Path) -> None:
    """The shipped engine locks where a store at `d` looks for them (`profiles/requirements/` beside it, as in a
    checkout): the base's release must be deployable, or every case would be refused for the missing lock before
    its own class is checked."""
    link = d.resolve().parent / "profiles" / "requirements"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(__file__).resolve().parents[2] / "profiles" / "requirements")


def build(folder: Path) -> Path:
    """The profiles directory of every case (the base they extend included); returns it."""
    d = folder / "profiles"
    d.mkdir(parents=True)
    link_locks(d)
    (d / "ok-base.yaml").write_text(BASE)
    for case in cases():
        case.setup(d)
    return d

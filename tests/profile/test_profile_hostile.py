"""Hostile profiles by class (tests/profile/hostile_cases.py): each refused by `toolkit profile validate` with exit
2 and a located error that says what is wrong, no traceback, nothing it must not show (the content of a file out
of the profiles directory, a secret, a terminal control). And the work is bounded: under a 1 GiB address-space
cap, no single validate of a hostile input takes over 1 s of CPU or 200 MB."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import hostile_cases  # type: ignore[import-not-found]
import pytest

from toolkit.cli.main import main

CASES = hostile_cases.cases()


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hostile_cases.build(tmp_path_factory.mktemp("hostile"))


def test_the_base_the_cases_extend_is_valid(hostile_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "validate", "ok-base", "--profiles-dir", str(hostile_dir)]) == 0, capsys.readouterr()


@pytest.mark.parametrize("case", CASES, ids=[ascii(c.name[:40]) for c in CASES])
def test_refused_located_and_nothing_shown_that_must_not_be(case: hostile_cases.Case, hostile_dir: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["profile", "validate", case.name, "--profiles-dir", str(hostile_dir)])
    out = capsys.readouterr()
    text = out.out + out.err
    assert code == 2, text
    assert case.says in text, text
    assert "Traceback" not in text
    for never in case.never:
        assert never not in text
    first = out.err.splitlines()[0]
    assert first.startswith("error: ")
    assert "\n  fix: " in out.err
    if case.located:
        assert str(hostile_dir) in first or "(the value is not shown" in first, first
    # Every line of the output is one the toolkit wrote: no control character from the input reached it.
    assert not any(c in text for c in "\x1b\r\x00\u202e"), ascii(text)
    assert len(text) < 20_000, "the output is bounded whatever the input (20 problems a file at most)"
    # The same through --json, which machines read.
    assert main(["profile", "validate", case.name, "--profiles-dir", str(hostile_dir), "--json"]) == 2
    data = capsys.readouterr().out
    for never in case.never:
        assert never not in data


_CAPPED = textwrap.dedent("""
    import contextlib, io, json, os, resource, sys, time
    from toolkit.cli.main import main

    folder, names = sys.argv[1], json.loads(sys.argv[2])

    def validate(name):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return main(["profile", "validate", name, "--profiles-dir", folder])

    validate("ok-base")  # imports and the flag catalogue loaded once, as in any process
    for name in names:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a process per case: its peak RSS is its own
            os.close(read)
            resource.setrlimit(resource.RLIMIT_AS, (1024**3, 1024**3))
            before = resource.getrusage(resource.RUSAGE_SELF)
            start = time.perf_counter()
            try:
                code = validate(name)
            except MemoryError:
                code = "MemoryError"
            wall_s = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu_s = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            peak_mib = after.ru_maxrss / 1024
            os.write(write, json.dumps({"name": name, "code": code, "cpu_s": cpu_s, "wall_s": wall_s,
                                        "peak_mib": peak_mib}).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            row = pipe.read()
        os.waitpid(pid, 0)
        print(row, flush=True)
""")


def test_every_hostile_case_is_refused_within_1_s_and_200_mb_under_a_1_gib_cap(hostile_dir: Path,
                                                                                 reliability: Any) -> None:
    names = [c.name for c in CASES]
    proc = subprocess.run([sys.executable, "-c", _CAPPED, str(hostile_dir), json.dumps(names)], capture_output=True,
                          text=True, check=False, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["name"] for r in rows] == names
    for row in rows:
        assert row["code"] == 2, row
        # The work is bounded in CPU seconds: on a loaded 2-core machine a 0.15 s case waited past 1 s of wall
        # for its turn (CI, load 13). A wait that is no work, a read that blocks on a FIFO, shows only in the wall
        # time: its bound is loose enough for any load and still ends a hang.
        assert row["cpu_s"] < 1.0, row
        assert row["wall_s"] < 15.0, row
        assert row["peak_mib"] < 200, row
    worst_s = max(rows, key=lambda r: r["cpu_s"])
    worst_mib = max(rows, key=lambda r: r["peak_mib"])
    classes = sorted({c.klass for c in CASES})
    reliability(
        fault=f"hostile profiles by class: the {len(CASES)} of tests/profile/hostile_cases.py ({', '.join(classes)}: "
        "over-long names and extends, numbers past int()'s digit limit, FIFOs, directories, link loops and "
        "/dev/zero as profiles, 2,000 unknown keys, 2,000 extra_args, 36,000 values in one file, a 40-deep and a "
        "1.6 MB extends chain, a missing parent among 3,000 profiles, a "
        "sparse 1 GiB patch, links out of the profiles directory, /etc/shadow as the key file, URL credentials, "
        "a literal key, an escape sequence in a file name, patches that touch other files or are not unified "
        "diffs, a layout that does not fit the model's heads or experts)",
        user_saw="exit 2, one located error each with its fix, nothing from outside the profiles directory, no "
        "secret and no terminal control in the output",
        recorded=f"each validate in its own process under a 1 GiB RLIMIT_AS: most CPU {worst_s['cpu_s']:.3f} s "
        f"({worst_s['name'][:30]!a}, {worst_s['wall_s']:.3f} s of wall), highest peak RSS (the pages the forked "
        f"process touched) "
        f"{worst_mib['peak_mib']:.0f} MiB ({worst_mib['name'][:30]!a})",
        next_run="nothing to undo: nothing was read past its cap and no host was contacted",
    )


def test_validate_all_over_a_deep_chain_checks_and_merges_each_profile_once(tmp_path: Path, monkeypatch) -> None:
    """16 profiles in one chain: validate all type-checks each file once and merges each parent once, not the
    chain again for every profile (which grows with the square of the depth)."""
    import importlib

    from toolkit.adapters.profile_store import ProfileStore
    from toolkit.app.profiles import check_profiles

    resolve_module = importlib.import_module("toolkit.core.profile.resolve")

    d = hostile_cases.build(tmp_path)
    for i in range(15):
        parent = f"link-{i + 1}" if i < 14 else "ok-base"
        (d / f"link-{i}.yaml").write_text(f"schema_version: 1\nname: link-{i}\nextends: {parent}\n"
                                          f"server:\n  max_running_requests: {64 + i}\n")
    checked: list[str] = []
    real = resolve_module.check_file
    monkeypatch.setattr(resolve_module, "check_file", lambda source: checked.append(source.name) or real(source))
    store = ProfileStore(d)
    names = ["ok-base", *(f"link-{i}" for i in range(15))]
    results = check_profiles(store, names)
    assert all(not [p for p in results[n] if p.severity == "error"] for n in names)
    assert sorted(checked) == sorted(names)
    assert store.resolve("link-0").spec.server.max_running_requests == 64
    assert store.resolve("link-13").chain == ["link-13", "link-14", "ok-base"]


SECRET_PROFILE = """\
schema_version: 1
name: leaky
extends: ok-base
description: "pulls from https://deploy:s3cr3tpass@git.example.org/x \\e[2Kok   fine [red]x[/red]"
env:
  HF_TOKEN: hf_s3cr3tt0ken
why:
  server.tp_size:
    reason: measured
    link: https://deploy:s3cr3tpass@git.example.org/runs/1
"""


@pytest.mark.parametrize("argv", [
    ["profile", "show", "leaky"],
    ["profile", "show", "leaky", "--json"],
    ["profile", "show", "leaky", "--resolved"],
    ["profile", "show", "leaky", "--resolved", "--json"],
    ["profile", "validate", "leaky"],
    ["profile", "validate", "leaky", "--json"],
    ["profile", "list"],
    ["profile", "list", "--json"],
    ["profile", "diff", "ok-base", "leaky"],
    ["profile", "diff", "ok-base", "leaky", "--json"],
])
def test_no_secret_and_no_terminal_control_in_any_output(argv: list[str], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A credential in a URL and the value of a secret-named variable are masked, and an escape sequence is shown
    escaped, in every command that prints a profile (as text, as JSON, as a table)."""
    d = tmp_path
    hostile_cases.link_locks(d)
    (d / "ok-base.yaml").write_text(hostile_cases.BASE)
    (d / "leaky.yaml").write_text(SECRET_PROFILE)
    code = main([*argv, "--profiles-dir", str(d)])
    out = capsys.readouterr()
    text = out.out + out.err
    assert code in (0, 1, 2), text
    assert "s3cr3tpass" not in text and "hf_s3cr3tt0ken" not in text, text
    assert "\x1b" not in text
    if argv[1] in ("show", "diff") and "--json" not in argv:
        assert "***" in text  # masked, not dropped: the reader sees that something is there


def test_render_masks_url_credentials_in_what_it_shows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path
    hostile_cases.link_locks(d)
    (d / "ok-base.yaml").write_text(hostile_cases.BASE)
    (d / "leaky.yaml").write_text("schema_version: 1\nname: leaky\nextends: ok-base\nenv:\n"
                                  "  HTTPS_PROXY: http://bot:pw0rdpw0rd@10.0.0.2:9000\n")
    for only in ([], ["--only", "env"], ["--only", "unit"], ["--json"]):
        main(["profile", "render", "leaky", "--profiles-dir", str(d), *only])
        text = capsys.readouterr().out
        assert "pw0rdpw0rd" not in text and "10.0.0.2:9000" in text, text


GIT_DIFF = f"""From 1234 Mon Sep 17 00:00:00 2001
Subject: [PATCH] a fix
---
 {hostile_cases.TARGET} | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

diff --git a/{hostile_cases.TARGET} b/{hostile_cases.TARGET}
index 1111111..2222222 100644
--- a/{hostile_cases.TARGET}
+++ b/{hostile_cases.TARGET}
@@ -1,3 +1,3 @@ def run():
 a
-old
+new
 b
\\ No newline at end of file
--
2.39.0
"""


@pytest.mark.parametrize(("name", "body", "warns"), [
    ("model-cache", "model:\n  local_path: /models/GLM-5-NVFP4\n", None),
    ("hf-home", "model:\n  local_path: /data/hf/glm5\nenv:\n  HF_HOME: /data/hf\n", None),
    ("elsewhere", "model:\n  local_path: /data/glm5\n", "model-path-root"),
    ("key-file", "server:\n  api_key_secret: file:/etc/sglang/api-key\n", None),
    ("key-home", "server:\n  api_key_secret: file:/home/ops/sglang.key\n", "secret-file-root"),
    ("ipv6", "server:\n  host: '::1'\n", None),
    ("git-patch", hostile_cases._patch_entry("git-patch", "git-patch.patch"), None),
    ("n" * 250, "", None),
])
def test_what_is_fine_stays_accepted(name: str, body: str, warns: str | None, tmp_path: Path) -> None:
    """No over-refusal: the confinement and the patch check accept what is in its place."""
    from toolkit.adapters.profile_store import ProfileStore
    from toolkit.app.profiles import check_profiles

    d = tmp_path / "profiles"
    (d / "patches").mkdir(parents=True)
    hostile_cases.link_locks(d)
    (d / "ok-base.yaml").write_text(hostile_cases.BASE)
    (d / "patches" / "git-patch.patch").write_text(GIT_DIFF)
    (d / f"{name}.yaml").write_text(f"schema_version: 1\nname: {name}\nextends: ok-base\n{body}")
    problems = check_profiles(ProfileStore(d), [name])[name]
    assert not [p for p in problems if p.severity == "error"], problems
    assert [p.rule_id for p in problems if p.severity == "warning"] == ([warns] if warns else [])


def test_an_unreadable_profile_is_a_located_error_not_a_traceback(tmp_path: Path) -> None:
    """EACCES: as a user who may not read the file (root reads everything, so the check runs as nobody)."""
    import os

    from toolkit.adapters.profile_store import ProfileStore
    from toolkit.core.errors import ToolkitError

    d = tmp_path / "profiles"
    d.mkdir()
    (d / "locked.yaml").write_text(hostile_cases.BASE.replace("ok-base", "locked"))
    (d / "locked.yaml").chmod(0)
    os.chmod(tmp_path, 0o755)
    os.chmod(tmp_path.parent, 0o755)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            ProfileStore(d).source("locked")
            message = "read"
        except ToolkitError as err:
            (problem,) = err.problems
            message = f"{problem.file}|{problem.message}|{problem.fix}"
        except BaseException as err:  # reported to the parent, which fails the test
            message = f"raised {type(err).__name__}: {err}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        message = pipe.read()
    os.waitpid(pid, 0)
    file, what, fix = message.split("|")
    assert file.endswith("locked.yaml") and "Permission denied" in what and "readable" in fix, message


def test_the_one_redaction_helper() -> None:
    """URL credentials and the values of secret-named assignments and flags, masked wherever they are shown or
    stored (a stored benchmark command too); what only looks alike stays."""
    from toolkit.core.text import printable, redact, redact_argv

    assert redact("see https://ci:tok3n@git.example.org/x and ssh://git@h/r") == \
        "see https://***@git.example.org/x and ssh://***@h/r"
    assert redact("env:\n  HF_TOKEN: hf_x\n  NCCL_DEBUG: WARN\nexport DB_PASSWORD=x\n") == \
        "env:\n  HF_TOKEN: ***\n  NCCL_DEBUG: WARN\nexport DB_PASSWORD=***\n"
    # A lower-case key (an acknowledged rule id) and a path to a key are no secret.
    assert redact("  public-bind-without-api-key: because\n  API_KEY_FILE: /etc/k\n") == \
        "  public-bind-without-api-key: because\n  API_KEY_FILE: /etc/k\n"
    assert redact_argv(["python", "--base-url", "http://u:pw@10.0.0.1:8000", "--api-key", "k"]) == \
        ["python", "--base-url", "http://***@10.0.0.1:8000", "--api-key", "***"]
    assert printable("a\x1b[2Kb\r\n\u202ec") == "a\\x1b[2Kb\\x0d\\x0a\\u202ec"
    assert printable("ok\n\tline", keep_newlines=True) == "ok\n\tline"

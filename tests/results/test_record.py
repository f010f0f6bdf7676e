"""Recording a probe run into a profile, through the real CLI, the real profile store and real files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.results.conftest import REPO, Scratch
from toolkit.adapters.files import stale_temp_files
from toolkit.adapters.profile_store import ProfileStore
from toolkit.app.record import load_results
from toolkit.cli.main import main
from toolkit.core.profile.hashing import spec_hash
from toolkit.core.results.block import join_results_block, split_results_block

GOLDEN = Path(__file__).resolve().parent / "golden" / "glm5-tp8.block.yaml"


def _record(s: Scratch, *extra: str, profile: str = "glm5-tp8", run: Path | None = None) -> int:
    return main(["results", "record", str(run or s.run), "--profile", profile, "--profiles-dir", str(s.profiles),
                 *extra])


@pytest.mark.parametrize("block_schema", ["current", "v1"])
def test_golden_record_changes_only_the_block_and_again_is_a_no_op(scratch: Scratch, block_schema: str) -> None:
    path = scratch.profiles / "glm5-tp8.yaml"
    if block_schema == "v1":  # a profile still carrying the importer's schema-1 block: migrated on the way
        author = split_results_block(path.read_text())[0]
        v1 = (Path(__file__).resolve().parent / "fixtures" / "glm5-tp8.v1-block.yaml").read_text()
        path.write_text(join_results_block(author, v1))
    before = path.read_bytes()
    assert _record(scratch) == 0
    after = path.read_bytes()
    author_before, _ = split_results_block(before.decode())
    author_after, block_after = split_results_block(after.decode())
    assert author_after == author_before, "the author's text above the marker changed"
    assert after != before
    # The spec hash is the profiles code's to define; the golden checks where it lands, not its value.
    current_hash = spec_hash(ProfileStore(scratch.profiles).resolve("glm5-tp8"))
    block = (block_after or "").replace(current_hash, "<SPEC_HASH>")
    assert "<SPEC_HASH>" in block
    # From the v1 block the imported entry has no stamp (the shipped block added it): a golden of its own.
    golden = GOLDEN if block_schema == "current" else GOLDEN.with_name("glm5-tp8.from-v1.block.yaml")
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(block)
    assert block == golden.read_text(), "block differs from golden (UPDATE_GOLDEN=1 to accept a real change)"

    stat = path.stat()
    others = {p.name: p.read_bytes() for p in scratch.profiles.glob("*.yaml") if p != path}
    assert _record(scratch) == 0
    assert path.read_bytes() == after, "recording the same run again changed the file"
    assert path.stat().st_mtime_ns == stat.st_mtime_ns and path.stat().st_ino == stat.st_ino, "it was rewritten"
    assert {p.name: p.read_bytes() for p in scratch.profiles.glob("*.yaml") if p != path} == others


def test_recorded_profile_still_loads_with_the_same_spec(scratch: Scratch) -> None:
    before = spec_hash(ProfileStore(scratch.profiles).resolve("glm5-tp8"))
    assert _record(scratch) == 0
    resolved = ProfileStore(scratch.profiles).resolve("glm5-tp8")
    assert spec_hash(resolved) == before, "recording results must not change what the spec hashes to"
    pr = load_results("glm5-tp8", scratch.profiles)
    entry = pr.block.entries[-1]
    assert entry.run_id == scratch.run.name
    assert entry.spec_hash == before
    assert entry.lab is not None and entry.lab.kind == "stand-in", "a stand-in run must say so in the entry"
    assert entry.artifacts == "runs/run-synthetic-tp8"
    # The imported seed figures survived the migration from schema 1.
    manual = pr.block.entries[0]
    assert manual.source == "manual" and manual.throughput.full_run.output_tok_per_s == 3740


def _break_block(s: Scratch) -> int:
    path = s.profiles / "glm5-tp8.yaml"
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    n = next(i for i, ln in enumerate(lines) if "output_tok_per_s: 3740" in ln)
    lines[n] = "    output_tok_per_s: 3740: 3900\n"  # a second colon, as a hasty hand edit leaves it
    path.write_text("".join(lines))
    return n + 1


def _newer_schema(s: Scratch) -> int:
    path = s.profiles / "glm5-tp8.yaml"
    lines = path.read_text().splitlines(keepends=True)
    n = next(i for i, ln in enumerate(lines) if ln.strip() == "schema_version: 2" and i > 50)
    lines[n] = "  schema_version: 99\n"
    path.write_text("".join(lines))
    return n + 1


def _drop_marker(s: Scratch) -> int:
    """The marker line deleted by hand: the block is now the author's text, and a record would add a second."""
    path = s.profiles / "glm5-tp8.yaml"
    lines = path.read_text().splitlines(keepends=True)
    n = next(i for i, ln in enumerate(lines) if ln.startswith("# --- results:"))
    del lines[n]
    path.write_text("".join(lines))
    return n + 1  # the `results:` line now sits where the marker was


def _not_utf8(s: Scratch) -> int:
    path = s.profiles / "glm5-tp8.yaml"
    path.write_bytes(path.read_bytes().replace(b"3,740 tok/s", b"3\xe9740 tok/s", 1))
    return 0


@pytest.mark.parametrize("case", ["no-profile", "no-summary", "broken-block", "newer-schema", "not-a-dir",
                                  "no-marker", "not-utf8"])
def test_bad_input_exits_2_and_writes_nothing(scratch: Scratch, case: str, capsys: pytest.CaptureFixture[str]
                                              ) -> None:
    profile, run, want_line = "glm5-tp8", scratch.run, None
    if case == "no-profile":
        profile = "glm5-nope"
    elif case == "no-summary":
        (scratch.run / "summary.json").unlink()
    elif case == "broken-block":
        want_line = _break_block(scratch)
    elif case == "newer-schema":
        want_line = _newer_schema(scratch)
    elif case == "no-marker":
        want_line = _drop_marker(scratch)
    elif case == "not-utf8":
        _not_utf8(scratch)
    else:
        run = scratch.root / "missing-run"
    before = scratch.snapshot()
    assert _record(scratch, profile=profile, run=run) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "fix:" in err
    assert scratch.snapshot() == before, "bad input must change nothing"
    if case == "no-profile":
        assert "glm5-nope" in err and "glm5-tp8" in err  # names the one asked for and the ones there are
    if case == "no-summary":
        assert "summary.json" in err
    if want_line is not None:
        assert f"glm5-tp8.yaml:{want_line}" in err, err
    if case == "newer-schema":
        assert "newer than this toolkit" in err
    if case == "no-marker":
        assert "results: a results block without the marker line" in err, err
    if case == "not-utf8":
        assert "not UTF-8" in err, err


def test_keep_last_prunes_toolkit_entries_but_keeps_manual_history(scratch: Scratch) -> None:
    runs = []
    for i in range(3):
        d = scratch.root / "runs" / f"run-{i}"
        d.mkdir()
        for f in scratch.run.iterdir():
            data = f.read_text()
            if f.name == "run.json":
                m = json.loads(data)
                m["started_at_utc"] = f"2026-12-0{i + 3}T00:00:00Z"
                data = json.dumps(m)
            (d / f.name).write_text(data)
        runs.append(d)
    for d in runs:
        assert _record(scratch, "--keep-last", "2", run=d) == 0
    block = load_results("glm5-tp8", scratch.profiles).block
    assert [e.run_id for e in block.entries] == ["manual-1", "run-1", "run-2"]
    assert block.keep_last == 2


def test_stale_entries_are_marked_after_a_spec_change(scratch: Scratch, capsys: pytest.CaptureFixture[str]) -> None:
    assert _record(scratch) == 0
    path = scratch.profiles / "glm5-tp8.yaml"
    path.write_text(path.read_text().replace("max_running_requests: 1024", "max_running_requests: 512", 1))
    capsys.readouterr()
    assert main(["results", "compare", "glm5-tp8", "glm5-baseline", "--all", "--json",
                 "--profiles-dir", str(scratch.profiles)]) == 0
    rows = [r for g in json.loads(capsys.readouterr().out)["data"]["groups"] for r in g["ranked"]]
    by_id = {(r["profile"], r["run_id"]): r for r in rows}
    assert by_id[("glm5-tp8", "run-synthetic-tp8")]["stale"] is True
    # the imported figures carry the hash of the spec that describes their setup: stale too
    assert by_id[("glm5-tp8", "manual-1")]["stale"] is True
    assert by_id[("glm5-baseline", "manual-1")]["stale"] is False
    assert main(["results", "compare", "glm5-tp8", "--all", "--profiles-dir", str(scratch.profiles)]) == 0
    assert "STALE" in capsys.readouterr().out


def test_compare_ranks_each_provenance_apart(scratch: Scratch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert _record(scratch) == 0
    capsys.readouterr()
    assert main(["results", "compare", "glm5-baseline", "glm5-tp8", "glm5-ep8", "--json",
                 "--profiles-dir", str(scratch.profiles)]) == 0
    out = json.loads(capsys.readouterr().out)["data"]
    imported, lab = out["groups"]  # the lab run and the imported figures: never in one ranking
    assert [(r["profile"], r["run_id"], r["rank_throughput"]) for r in imported["ranked"]] == [
        ("glm5-tp8", "manual-1", 1), ("glm5-baseline", "manual-1", 2)]
    assert imported["throughput_kind"] == "full" and imported["ranked"][0]["rank_tok_per_j"] is None
    (tp8,) = lab["ranked"]
    assert tp8["run_id"] == "run-synthetic-tp8" and tp8["throughput_kind"] == "steady"
    assert tp8["rank_throughput"] == 1 and tp8["rank_tok_per_j"] == 1 and tp8["provenance"] == "stand-in"
    assert lab["apart"].startswith("imported from notes vs lab stand-in")
    assert out["no_results"] == ["glm5-ep8"]


def test_secrets_in_the_run_never_reach_the_profile(scratch: Scratch) -> None:
    secret = "sk-test-0123456789abcdef"
    m = json.loads((scratch.run / "run.json").read_text())
    m["command"] = ["python3", "-m", "sglang.bench_serving", "--api-key", secret]
    (scratch.run / "run.json").write_text(json.dumps(m))
    b = json.loads((scratch.run / "bench.jsonl").read_text())
    b["server_info"] = {**b["server_info"], "api_key": secret}
    b["api_key"] = secret
    (scratch.run / "bench.jsonl").write_text(json.dumps(b) + "\n")
    assert _record(scratch) == 0
    assert secret not in (scratch.profiles / "glm5-tp8.yaml").read_text()


CHILD = textwrap.dedent(
    """
    import os, sys, time
    from toolkit.cli.main import main
    real_write = os.write
    def half_write(fd, data):
        n = real_write(fd, bytes(data[: len(data) // 2]))
        print("STOPPED", flush=True)
        time.sleep(120)
        return n
    os.write = half_write
    sys.exit(main(sys.argv[1:]))
    """
)


def test_record_killed_mid_write_leaves_the_profile_intact(scratch: Scratch) -> None:
    path = scratch.profiles / "glm5-tp8.yaml"
    before = path.read_bytes()
    args = ["results", "record", str(scratch.run), "--profile", "glm5-tp8", "--profiles-dir", str(scratch.profiles)]
    child = subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "STOPPED"
        # The stopped child's temp file is a write in flight (its writer lives), not yet a leftover.
        assert stale_temp_files(path) == []
        torn = sorted(path.parent.glob(f".{path.name}.{child.pid}.*.tmp"))
        assert len(torn) == 1 and torn[0].stat().st_size > 0, "the child was stopped inside the write"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert path.read_bytes() == before
    ProfileStore(scratch.profiles).resolve("glm5-tp8")  # still a valid profile
    assert _record(scratch) == 0
    assert stale_temp_files(path) == []


def test_textconv_shows_each_entry_as_one_line_of_figures(scratch: Scratch, capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    assert _record(scratch) == 0
    capsys.readouterr()
    assert main(["profile", "textconv", str(scratch.profiles / "glm5-tp8.yaml")]) == 0
    out = capsys.readouterr().out
    assert "results: 2 entries (schema 2, keep_last 10)" in out
    assert ("  manual-1 [imported from notes] | 2026-02 | 1,024 prompts, random 256 in / 128 out (range 0), rate inf, "
            "no concurrency cap | 3,740 tok/s (full run) | 250 W/GPU | busy-but-waiting") in out
    assert ("  run-synthetic-tp8 [lab stand-in] | 2026-12-02T12:00:00Z | 1,024 prompts, random 256 in / 128 out "
            "(range 1), rate inf, no concurrency cap | 3,554 tok/s (steady) | 247.2 W/GPU | 0.5572 J/tok | "
            "busy-but-waiting") in out


def test_migrate_rewrites_a_v1_block_once_and_only_the_block(scratch: Scratch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = scratch.profiles / "glm5-baseline.yaml"
    author = split_results_block(path.read_text())[0]
    v1 = (Path(__file__).resolve().parent / "fixtures" / "glm5-baseline.v1-block.yaml").read_text()
    path.write_text(join_results_block(author, v1))
    assert main(["results", "migrate", "glm5-baseline", "--profiles-dir", str(scratch.profiles)]) == 0
    assert "rewritten" in capsys.readouterr().out
    after = path.read_text()
    assert split_results_block(after)[0] == author and "schema_version: 2" in after
    assert main(["results", "migrate", "all", "--profiles-dir", str(scratch.profiles)]) == 0
    assert "glm5-baseline: already current" in capsys.readouterr().out
    assert path.read_text() == after


def test_parallel_recorders_into_one_profile_lose_no_entry(scratch: Scratch) -> None:
    # Four real processes record four runs at once (a sweep's parallel points); the file lock makes the
    # read-modify-write of the block one at a time, so every entry lands.
    runs = []
    for i in range(4):
        d = scratch.root / "runs" / f"par-{i}"
        shutil.copytree(scratch.run, d)
        runs.append(d)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-m", "toolkit", "results", "record", str(d), "--profile", "glm5-tp8",
                               "--profiles-dir", str(scratch.profiles), "--json"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for d in runs]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    ids = [e.run_id for e in load_results("glm5-tp8", scratch.profiles).block.entries]
    assert sorted(ids) == ["manual-1", "par-0", "par-1", "par-2", "par-3"]

"""Semantic diff through extends:, and the same view in a real `git diff` via textconv."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.cli.main import main
from toolkit.core.profile.diff import diff_profiles
from toolkit.core.results.profile_diff import profile_diff

REPO = Path(__file__).resolve().parents[2]


def test_baseline_to_tp8(shipped) -> None:
    d = diff_profiles(shipped.resolve("glm5-baseline"), shipped.resolve("glm5-tp8"))
    by_path = {c.path: c for c in d.changes}
    mrr = by_path["server.max_running_requests"]
    assert (mrr.kind, mrr.old, mrr.new) == ("changed", 64, 1024)
    assert mrr.why and "1024" in mrr.why
    assert by_path["server.nsa_decode_backend"].kind == "added"
    assert by_path["server.cuda_graph"].old is True and by_path["server.cuda_graph"].new is False
    assert "server.tp_size" not in by_path
    assert "~ server.max_running_requests: 64 -> 1024" in d.render()


def test_removed_knob_and_inherited_change(write_profiles, base_yaml) -> None:
    store = write_profiles(
        {
            "base": base_yaml,
            "a": "schema_version: 1\nname: a\nextends: base\n",
            "b": "schema_version: 1\nname: b\nextends: base\nserver:\n  nsa_decode_backend: null\n  tp_size: 4\n"
            "why:\n  server.tp_size: {reason: half the allreduce group, link: 'https://example.org/t'}\n",
        }
    )
    d = diff_profiles(store.resolve("a"), store.resolve("b"))
    kinds = {c.path: (c.kind, c.why) for c in d.changes}
    assert kinds["server.nsa_decode_backend"] == ("removed", None)
    assert kinds["server.tp_size"] == ("changed", "half the allreduce group (https://example.org/t)")


def test_profile_diff_puts_the_results_under_the_knobs(shipped) -> None:
    """The knob diff alone has no results; `profile diff` adds the latest entries' deltas as a section."""
    a, b = shipped.resolve("glm5-baseline"), shipped.resolve("glm5-tp8")
    assert diff_profiles(a, b).sections == []
    text = profile_diff(a, b).render()
    assert text.index("~ server.max_running_requests") < text.index("results (glm5-baseline -> glm5-tp8")


def test_cli_diff(capsys) -> None:
    assert main(["profile", "diff", "glm5-baseline", "glm5-tp8", "--profiles-dir", str(REPO / "profiles")]) == 0
    assert "~ server.max_running_requests: 64 -> 1024" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_diff_shows_the_semantic_view(tmp_path: Path) -> None:
    """The documented git config line + .gitattributes make `git diff` of a profile show knob lines."""
    repo = tmp_path / "team"
    (repo / "profiles").mkdir(parents=True)
    shutil.copy(REPO / ".gitattributes", repo / ".gitattributes")
    for name in ("glm5-baseline", "glm5-tp8"):
        shutil.copy(REPO / "profiles" / f"{name}.yaml", repo / "profiles" / f"{name}.yaml")
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path), "TOOLKIT_PROFILES_DIR": ""}
    toolkit = f"{sys.executable} -m toolkit"

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    # The documented line (docs/profiles.md), with this test's interpreter standing in for `toolkit`.
    git("config", "diff.toolkit-profile.textconv", f"{toolkit} profile textconv")
    git("add", ".")
    git("commit", "-qm", "profiles")
    path = repo / "profiles" / "glm5-tp8.yaml"
    path.write_text(path.read_text().replace("max_running_requests: 1024", "max_running_requests: 2048"))
    out = git("diff", "--", "profiles/glm5-tp8.yaml")
    assert "-server.max_running_requests = 1024" in out
    assert "+server.max_running_requests = 2048" in out
    assert "why: 64 -> 1024 let the scheduler" in out
    changed = [line for line in out.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    # The knob, and the imported entry, which measured the spec before the change: now marked stale.
    assert len(changed) == 4, out
    assert changed[-1].startswith("+  manual-1 [imported from notes]") and changed[-1].endswith("| STALE")


def test_textconv_of_a_broken_file_falls_back_to_text(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("server: [\n")
    assert main(["profile", "textconv", str(bad), "--profiles-dir", str(REPO / "profiles")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# toolkit textconv: shown as text") and out.endswith("server: [\n")


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_textconv_reads_an_old_revisions_parent_at_that_revision_in_a_shell_without_the_venv(tmp_path: Path) -> None:
    """`toolkit profile install-textconv` writes an absolute command, so `git diff` works with a bare PATH; the old
    side's parent is read at its own commit (an inherited value that changed shows as changed), and a copy that
    is in no commit says it cannot be resolved there."""
    repo = tmp_path / "team"
    (repo / "profiles").mkdir(parents=True)
    shutil.copy(REPO / ".gitattributes", repo / ".gitattributes")
    base = "schema_version: 1\nname: base\nserver:\n  max_running_requests: {mrr}\n  tp_size: 8\n"
    child = "schema_version: 1\nname: child\nextends: base\nserver:\n  cuda_graph: {graph}\n"
    (repo / "profiles" / "base.yaml").write_text(base.format(mrr=64))
    (repo / "profiles" / "child.yaml").write_text(child.format(graph="true"))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    subprocess.run([sys.executable, "-m", "toolkit", "profile", "install-textconv"], cwd=repo, check=True,
                   env={**os.environ, "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}, capture_output=True)
    command = git("config", "diff.toolkit-profile.textconv").strip()
    assert f"$({shlex.quote(sys.executable)} -m toolkit profile textconv " in command and sys.executable.startswith("/")
    git("add", ".")
    git("commit", "-qm", "1")
    # One commit raises the parent's cap and turns the child's graphs off: the child inherits 128 from now on.
    (repo / "profiles" / "base.yaml").write_text(base.format(mrr=128))
    (repo / "profiles" / "child.yaml").write_text(child.format(graph="false"))
    git("commit", "-qam", "2")
    out = git("diff", "HEAD~1", "HEAD", "--", "profiles/child.yaml")  # both sides are copies of blobs
    assert "-server.max_running_requests = 64" in out and "+server.max_running_requests = 128" in out, out
    assert "-server.cuda_graph = true" in out and "+server.cuda_graph = false" in out
    assert "# parents as of commit" in out  # the old side says where its parent was read: not today's

    lone = tmp_path / "elsewhere" / "child.yaml"
    lone.parent.mkdir()
    lone.write_text(child.format(graph="maybe-never-committed"))
    proc = subprocess.run([sys.executable, "-m", "toolkit", "profile", "textconv", str(lone)], cwd=repo,
                          capture_output=True, text=True, check=True, env={**os.environ, "TOOLKIT_PROFILES_DIR": ""})
    assert proc.stdout.startswith("# toolkit textconv: shown as text (this version of profiles/child.yaml is in no "
                                  "commit and not staged: its parents cannot be resolved at its revision)")


def test_diff_exit_code(capsys) -> None:
    profiles = str(REPO / "profiles")
    assert main(["profile", "diff", "glm5-baseline", "glm5-tp8", "--profiles-dir", profiles, "--exit-code"]) == 1
    assert main(["profile", "diff", "glm5-tp8", "glm5-tp8", "--profiles-dir", profiles, "--exit-code"]) == 0
    assert main(["profile", "diff", "glm5-baseline", "glm5-tp8", "--profiles-dir", profiles]) == 0


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_diff_after_a_merge_commit_shows_the_knob_with_its_why(tmp_path: Path) -> None:
    """A version last written by a merge commit (both sides changed the file, so only the merge holds that blob):
    `git diff HEAD~1` and `git log -p` of the next change show the knob's -/+ lines with their whys, not raw YAML.
    """
    repo = tmp_path / "team"
    (repo / "profiles").mkdir(parents=True)
    shutil.copy(REPO / ".gitattributes", repo / ".gitattributes")
    text = ("schema_version: 1\nname: p\ndescription: {desc}\nserver:\n  tp_size: 8\n  max_running_requests: {mrr}\n"
            "why:\n  server.max_running_requests:\n    reason: {why}\n  server.tp_size:\n    reason: {tp_why}\n")
    fields = {"desc": "one", "mrr": 512, "why": "the lab peaked at 150 running", "tp_why": "all 8 GPUs"}
    path = repo / "profiles" / "p.yaml"
    path.write_text(text.format(**fields))
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path), "TOOLKIT_PROFILES_DIR": ""}

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout

    git("init", "-q", "-b", "main")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    git("config", "diff.toolkit-profile.textconv", f"{sys.executable} -m toolkit profile textconv")
    git("add", ".")
    git("commit", "-qm", "1")
    git("checkout", "-qb", "topic")
    path.write_text(text.format(**{**fields, "desc": "two"}))
    git("commit", "-qam", "topic: the description")
    git("checkout", "-q", "main")
    path.write_text(text.format(**{**fields, "tp_why": "the whole model needs all 8 GPUs"}))
    git("commit", "-qam", "main: a why")
    git("merge", "-q", "--no-edit", "topic")  # the merged file is in neither parent
    merged = git("rev-parse", "HEAD:profiles/p.yaml").strip()
    assert merged not in {git("rev-parse", f"HEAD^{n}:profiles/p.yaml").strip() for n in (1, 2)}
    path.write_text(text.format(desc="two", mrr=768, why="768 held the queue at zero in the lab",
                                tp_why="the whole model needs all 8 GPUs"))
    git("commit", "-qam", "768")
    for out in (git("diff", "HEAD~1", "--", "profiles/p.yaml"), git("log", "-p", "-1", "--", "profiles/p.yaml")):
        assert "shown as text" not in out, out
        changed = [line for line in out.splitlines() if line.startswith(("+", "-")) and not line.startswith(
            ("+++", "---"))]
        assert changed == ["-server.max_running_requests = 512    # why: the lab peaked at 150 running",
                           "+server.max_running_requests = 768    # why: 768 held the queue at zero in the lab"], out


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_diff_after_the_venv_moved_shows_text_and_how_to_fix_it(tmp_path: Path) -> None:
    """The config line names an interpreter that is gone (the venv was rebuilt elsewhere, the clone moved): `git diff`
    still works, showing the text under one line that says how to fix it, instead of dying."""
    from toolkit.app.profiles import textconv_command

    repo = tmp_path / "team"
    (repo / "profiles").mkdir(parents=True)
    shutil.copy(REPO / ".gitattributes", repo / ".gitattributes")
    path = repo / "profiles" / "p.yaml"
    path.write_text("schema_version: 1\nname: p\nserver:\n  max_running_requests: 512\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=False)

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    gone = tmp_path / "moved" / ".venv" / "bin" / "python"
    git("config", "diff.toolkit-profile.textconv", textconv_command(str(gone)))
    git("add", ".")
    git("commit", "-qm", "1")
    path.write_text(path.read_text().replace("512", "768"))
    proc = git("diff", "-U9", "--", "profiles/p.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "+# toolkit textconv could not start" not in proc.stdout  # the same line on both sides: context
    assert " # toolkit textconv could not start (" in proc.stdout and "run scripts/setup" in proc.stdout
    assert "-  max_running_requests: 512" in proc.stdout and "+  max_running_requests: 768" in proc.stdout
    # With the interpreter back in place, the same config line gives the knob view.
    git("config", "diff.toolkit-profile.textconv", textconv_command(sys.executable))
    proc = git("diff", "--", "profiles/p.yaml")
    assert "+server.max_running_requests = 768" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_diff_across_revisions_and_every_profile_a_change_reaches(tmp_path: Path, monkeypatch, capsys) -> None:
    """`profile diff REV:NAME NAME` compares a profile with itself at a revision (its parents read there too), and
    `--since REV` lists every profile whose resolved spec or render moved: a parent's 1024 -> 768 shows in the
    children that inherit it, and a profile that sets its own value is not listed."""
    repo = tmp_path / "team"
    shutil.copytree(REPO / "profiles", repo / "profiles")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TOOLKIT_PROFILES_DIR", raising=False)
    monkeypatch.chdir(repo)

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    git("add", ".")
    git("commit", "-qm", "1")
    tp8 = repo / "profiles" / "glm5-tp8.yaml"
    tp8.write_text(tp8.read_text().replace("max_running_requests: 1024", "max_running_requests: 768", 1))
    git("commit", "-qam", "768")

    assert main(["profile", "diff", "HEAD~1:glm5-tp8", "glm5-tp8", "--json"]) == 0
    changes = json.loads(capsys.readouterr().out)["data"]["changes"]
    assert [(c["path"], c["old"], c["new"]) for c in changes] == [("server.max_running_requests", 1024, 768)]
    assert main(["profile", "diff", "--since", "HEAD~1", "--json"]) == 0
    listed = {c["name"]: c for c in json.loads(capsys.readouterr().out)["data"]}
    inheriting = {"glm5-tp8", "glm5-ep8", "glm5-tp4-pp2", "glm5-tp8-0.5.23", "glm5-2node", "glm5-tp8-x2"}
    assert set(listed) == inheriting, listed  # glm5-baseline sets its own 64
    for name in inheriting:
        assert listed[name]["status"] == "changed" and "argv" in listed[name]["render_changed"]
        assert [k["new"] for k in listed[name]["knobs"]] == [768]
    assert main(["profile", "diff", "--since", "HEAD"]) == 0
    assert capsys.readouterr().out == "profiles changed since HEAD: 0\n"
    assert main(["profile", "diff", "nope~9:glm5-tp8", "glm5-tp8"]) == 2
    assert "names no commit here" in capsys.readouterr().err

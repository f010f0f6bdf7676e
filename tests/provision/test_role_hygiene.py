"""The provision roles keep the habits STYLE.md asks for: every default documented in argument_specs and the
README, FQCN modules from collections requirements.yml pins, preflight first, no_log where a secret is used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = ["proxmox_gpu_host", "lxc_gpu_container", "container_nvidia_userspace"]
# Task keywords that are not modules.
KEYWORDS = {
    "name", "when", "register", "loop", "vars", "tags", "notify", "listen", "changed_when", "failed_when",
    "check_mode", "no_log", "delegate_to", "block", "rescue", "always", "become", "until", "retries", "delay",
    "ignore_errors", "environment", "loop_control", "run_once", "args", "apply", "ignore_unreachable",
}


def _tasks(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for t in items or []:
        out.append(t)
        for key in ("block", "rescue", "always"):
            out += _tasks(t.get(key, []))
    return out


def _modules(path: Path) -> list[tuple[str, dict[str, Any]]]:
    data = yaml.safe_load(path.read_text()) or []
    if isinstance(data, dict):
        return []
    found = []
    for task in _tasks(data):
        mods = [k for k in task if k not in KEYWORDS]
        found += [(m, task) for m in mods]
    return found


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_documented(role: str) -> None:
    root = REPO / "roles" / role
    defaults = set(yaml.safe_load((root / "defaults/main.yml").read_text()))
    specs = set(yaml.safe_load((root / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"])
    readme = (root / "README.md").read_text()
    assert defaults <= specs, sorted(defaults - specs)
    assert all(name.startswith(role + "_") for name in specs)
    assert [n for n in sorted(specs) if f"`{n}`" not in readme] == []


@pytest.mark.parametrize("role", ROLES)
def test_fqcn_modules_from_pinned_collections_and_preflight_first(role: str) -> None:
    pinned = {c["name"] if isinstance(c, dict) else c
              for c in yaml.safe_load((REPO / "requirements.yml").read_text())["collections"]}
    root = REPO / "roles" / role
    for path in sorted((root / "tasks").glob("*.yml")) + sorted((root / "handlers").glob("*.yml")):
        for module, task in _modules(path):
            assert module.count(".") >= 2, f"{path.name}: {task.get('name')}: {module} is not fully qualified"
            collection = ".".join(module.split(".")[:2])
            assert collection == "ansible.builtin" or collection in pinned, f"{module} from an unpinned collection"
            assert module != "ansible.builtin.shell", f"{path.name}: {task.get('name')}: shell where command does"
    main = yaml.safe_load((root / "tasks/main.yml").read_text())
    assert main[0]["ansible.builtin.include_tasks"]["file"] == "preflight.yml"


def test_secret_tasks_have_no_log() -> None:
    for role in ROLES:
        for path in (REPO / "roles" / role / "tasks").glob("*.yml"):
            for _module, task in _modules(path):
                if "password" in yaml.safe_dump(task.get("ansible.builtin.command", "")):
                    assert task.get("no_log") is True, f"{path}: {task['name']}"


def test_playbooks_open_with_the_shared_preflight() -> None:
    for book in ("host", "container"):
        plays = yaml.safe_load((REPO / "playbooks" / f"{book}.yml").read_text())
        assert plays[0]["ansible.builtin.import_playbook"] == "preflight.yml"
    site = yaml.safe_load((REPO / "playbooks/site.yml").read_text())
    assert [p["ansible.builtin.import_playbook"] for p in site] == ["host.yml", "container.yml", "deploy.yml"]


def test_ansible_lint_production_profile() -> None:
    import shutil
    import subprocess
    import sys

    lint = Path(sys.executable).parent / "ansible-lint"
    if not lint.exists() and shutil.which("ansible-lint") is None:
        pytest.skip("ansible-lint is not installed (scripts/setup installs it with the dev extras)")
    paths = [f"roles/{r}" for r in ROLES] + [f"playbooks/{b}.yml" for b in ("host", "container", "preflight", "doctor",
                                                                                  "stop_probe")]
    proc = subprocess.run(
        [str(lint) if lint.exists() else "ansible-lint", "--offline", "--nocolor", *paths],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "ANSIBLE_ROLES_PATH": str(REPO / "roles")},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]

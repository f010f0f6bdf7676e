"""The roles keep the habits STYLE.md asks for (prometheus-community's node_exporter, geerlingguy's docker): a
README repeating every default, typed argument_specs in step with the defaults, preflight first, task files wired
one way, prefixed variables, FQCN modules from the collections requirements.yml pins, no_log where a secret is
used. And they are production roles: no lab switch, no stand-in, no import of the toolkit, so they read the same
whether a lab is there or not (the lab plugs in through its inventory)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks" / "main.yml").exists())
# Task keywords that are not modules.
KEYWORDS = {
    "name", "when", "register", "loop", "vars", "tags", "notify", "listen", "changed_when", "failed_when",
    "check_mode", "no_log", "delegate_to", "block", "rescue", "always", "become", "until", "retries", "delay",
    "ignore_errors", "environment", "loop_control", "run_once", "args", "apply", "ignore_unreachable",
}
# Keywords whose value is a bare Jinja expression.
CONDITIONALS = {"when", "changed_when", "failed_when", "until", "that"}
IMPORT = "ansible.builtin.import_tasks"


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


def _main(role: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load((REPO / "roles" / role / "tasks/main.yml").read_text()))


def _tags(role: str) -> set[str]:
    return {t for task in _main(role) for t in task.get("tags", [])} - {"always"}


def test_every_role_is_checked() -> None:
    assert len(ROLES) >= 6 and {"proxmox_gpu_host", "sglang_service", "bench_probe"} <= set(ROLES)


@pytest.mark.parametrize("role", ROLES)
def test_every_role_has_a_readme_a_preflight_and_argument_specs(role: str) -> None:
    root = REPO / "roles" / role
    missing = [f for f in ("README.md", "tasks/preflight.yml", "meta/argument_specs.yml", "defaults/main.yml",
                           "meta/main.yml") if not (root / f).is_file()]
    assert missing == [], f"roles/{role} lacks {missing}"
    readme = (root / "README.md").read_text()
    for heading in ("## Variables", "## Example", "## Tags"):
        assert heading in readme, f"roles/{role}/README.md has no {heading!r} section"
    tags = readme[readme.index("## Tags"):]
    assert [t for t in sorted(_tags(role)) if f"`{t}`" not in tags] == [], f"roles/{role}/README.md: tags not listed"


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_documented_and_typed_in_step(role: str) -> None:
    root = REPO / "roles" / role
    defaults = yaml.safe_load((root / "defaults/main.yml").read_text())
    specs = yaml.safe_load((root / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    readme = (root / "README.md").read_text()
    assert sorted(set(defaults) - set(specs)) == [], "defaults without an argument spec"
    assert sorted(set(specs) - set(defaults)) == [], "argument specs without a default (say it in defaults/main.yml)"
    assert all(name.startswith(role + "_") for name in specs), "public variables carry the role's prefix"
    table = readme[readme.index("## Variables"):]
    assert [n for n in sorted(specs) if f"| `{n}` |" not in table] == [], "defaults missing from the README's table"
    for name, spec in specs.items():
        assert spec.get("type") and spec.get("description"), f"{name}: no type or description"
        if "default" in spec:
            assert spec["default"] == defaults[name], f"{name}: argument_specs says {spec['default']!r}, " \
                                                      f"defaults/main.yml {defaults[name]!r}"


@pytest.mark.parametrize("role", ROLES)
def test_private_and_registered_variables_carry_the_role_prefix(role: str) -> None:
    root = REPO / "roles" / role
    vars_file = root / "vars/main.yml"
    private = list(yaml.safe_load(vars_file.read_text()) or {}) if vars_file.exists() else []
    assert [v for v in private if not v.startswith(f"_{role}_")] == []
    for path in sorted((root / "tasks").glob("*.yml")) + sorted((root / "handlers").glob("*.yml")):
        for module, task in _modules(path):
            if "register" in task:
                assert task["register"].startswith(f"__{role}_"), f"{path.name}: register {task['register']}"
            if module == "ansible.builtin.set_fact":
                bad = [k for k in task[module] if not k.startswith(f"__{role}_")]
                assert bad == [], f"{path.name}: set_fact {bad}"


@pytest.mark.parametrize("role", ROLES)
def test_task_files_are_wired_one_way_preflight_first(role: str) -> None:
    """tasks/main.yml imports its phases statically (tags and check mode see every task); the preflight comes
    first and runs whatever tags are asked."""
    main = _main(role)
    first = main[0]
    assert first.get(IMPORT) == "preflight.yml", f"roles/{role}: the first task is not the preflight's import"
    assert {f"{role}_preflight", "always"} <= set(first.get("tags", []))
    for task in main:
        assert "ansible.builtin.include_tasks" not in task and "include_tasks" not in task, \
            f"roles/{role}/tasks/main.yml: {task.get('name')} is included; every role imports its task files"
        if IMPORT in task:
            assert isinstance(task[IMPORT], str) and (REPO / "roles" / role / "tasks" / task[IMPORT]).is_file()
            assert role in task.get("tags", []) and any(t.startswith(role + "_") for t in task["tags"])
    # No task file lies unused: each is imported or included by main, another task file or a handler.
    root = REPO / "roles" / role
    referenced = {"main.yml"}
    for path in sorted((root / "tasks").glob("*.yml")) + sorted((root / "handlers").glob("*.yml")):
        for module, task in _modules(path):
            if module in (IMPORT, "ansible.builtin.include_tasks"):
                # An include's `file:` form carries `apply:` (the tags its tasks get).
                target = task[module]
                referenced.add(str(target["file"] if isinstance(target, dict) else target))
    assert sorted(p.name for p in (root / "tasks").glob("*.yml") if p.name not in referenced) == []


def _jinja(text: str) -> list[str]:
    return re.findall(r"{{(.*?)}}|{%(.*?)%}", text, re.S)


def _expressions(node: Any, key: str = "") -> list[str]:
    """Every Jinja expression in a YAML document: inside {{ }} / {% %}, and the bare ones of conditionals."""
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append(str(k))  # a variable defined under that name
            out += _expressions(v, str(k))
    elif isinstance(node, list):
        for v in node:
            out += _expressions(v, key)
    elif isinstance(node, str):
        out += ["".join(parts) for parts in _jinja(node)]
        if key in CONDITIONALS:
            out.append(node)
    return out


LAB_VARIABLE = re.compile(r"(?<![\w.])lab(?![\w-])")


@pytest.mark.parametrize("role", ROLES)
def test_no_lab_switch_and_no_stand_in_in_production_roles(role: str) -> None:
    """The lab plugs in through its inventory (role variables a real host could set too): a role that reads
    `lab`, a `lab_*` variable or knows a stand-in has a branch no real host runs."""
    for path in sorted(p for p in (REPO / "roles" / role).rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        text = path.read_text()
        rel = path.relative_to(REPO)
        assert not re.search(r"standin", text, re.I), f"{rel} mentions a stand-in"
        assert not re.search(r"(?<![\w.])lab_\w+", text), f"{rel} mentions a lab_* variable"
        if path.suffix == ".yml":
            exprs = _expressions(yaml.safe_load(text))
        elif path.suffix == ".j2":
            exprs = ["".join(parts) for parts in _jinja(text)]
        else:
            continue
        assert [e for e in exprs if LAB_VARIABLE.search(e)] == [], f"{rel} reads a variable `lab`"


def test_the_lab_check_sees_what_it_looks_for() -> None:
    """It finds `lab` in an expression and a conditional, and reads no prose outside expressions."""
    doc = yaml.safe_load("- name: x\n  ansible.builtin.debug: {msg: \"{{ 'a' if lab | default(false) else 'b' }}\"}\n"
                         "- name: y\n  ansible.builtin.debug: {msg: hi}\n  when: not lab\n")
    assert [bool(LAB_VARIABLE.search(e)) for e in _expressions(doc) if "lab" in e] == [True, True]
    assert not [e for e in _expressions(yaml.safe_load("a: the lab points it {{ x }}\n")) if LAB_VARIABLE.search(e)]


@pytest.mark.parametrize("role", ROLES)
def test_role_python_does_not_import_the_toolkit(role: str) -> None:
    """Filter plugins run on the controller, files/ scripts on the hosts: neither may need the toolkit installed."""
    for path in sorted((REPO / "roles" / role).rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert [m for m in imported if m.split(".")[0] == "toolkit"] == [], f"{path.relative_to(REPO)} imports toolkit"


@pytest.mark.parametrize("role", ROLES)
def test_fqcn_modules_from_pinned_collections(role: str) -> None:
    pinned = {c["name"] if isinstance(c, dict) else c
              for c in yaml.safe_load((REPO / "requirements.yml").read_text())["collections"]}
    root = REPO / "roles" / role
    for path in sorted((root / "tasks").glob("*.yml")) + sorted((root / "handlers").glob("*.yml")):
        for module, task in _modules(path):
            assert module.count(".") >= 2, f"{path.name}: {task.get('name')}: {module} is not fully qualified"
            collection = ".".join(module.split(".")[:2])
            assert collection == "ansible.builtin" or collection in pinned, f"{module} from an unpinned collection"
            assert module != "ansible.builtin.shell", f"{path.name}: {task.get('name')}: shell where command does"


def test_secret_tasks_have_no_log() -> None:
    for role in ROLES:
        for path in (REPO / "roles" / role / "tasks").glob("*.yml"):
            for _module, task in _modules(path):
                if re.search(r"password|_token\b|api_key\b", yaml.safe_dump(task.get("ansible.builtin.command", ""))):
                    assert task.get("no_log") is True, f"{path}: {task['name']}"


def test_playbooks_open_with_the_shared_preflight() -> None:
    for book in ("host", "container", "containers_preflight"):
        plays = yaml.safe_load((REPO / "playbooks" / f"{book}.yml").read_text())
        assert plays[0]["ansible.builtin.import_playbook"] == "preflight.yml"
    site = yaml.safe_load((REPO / "playbooks/site.yml").read_text())
    assert [p["ansible.builtin.import_playbook"] for p in site] == [
        "containers_preflight.yml", "host.yml", "container.yml", "deploy.yml"]


def test_ansible_lint_production_profile() -> None:
    import os
    import shutil
    import subprocess
    import sys

    lint = Path(sys.executable).parent / "ansible-lint"
    if not lint.exists() and shutil.which("ansible-lint") is None:
        pytest.skip("ansible-lint is not installed (scripts/setup installs it with the dev extras)")
    paths = [f"roles/{r}" for r in ROLES] + [f"playbooks/{b}.yml" for b in ("host", "container", "preflight", "doctor",
                                                                                  "stop_probe", "deploy",
                                                                                  "containers_preflight",
                                                                                  "fleet_preflight")]
    proc = subprocess.run(
        [str(lint) if lint.exists() else "ansible-lint", "--offline", "--nocolor", *paths],
        # 25 s of CPU, but 254 s of wall at load 30 on 2 cores (the CI's shards beside it): 300 s ran out there.
        cwd=REPO, capture_output=True, text=True, timeout=900,
        env={**os.environ, "ANSIBLE_ROLES_PATH": str(REPO / "roles")},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]

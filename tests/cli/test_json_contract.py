"""The `--json` contract: every command prints one envelope (`kind`, `schema_version`, `data`) through
toolkit.cli.envelope, each kind's committed schema in docs/schemas/ is the one its types generate, and real output
of the commands validates against it; a refusal is the "error" kind with a code, on stdout."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from toolkit.cli.envelope import SCHEMA_VERSIONS
from toolkit.cli.main import main
from toolkit.cli.schemas import DATA_TYPES, schema

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "docs" / "schemas"
PROBE_RUN = REPO / "tests" / "fixtures" / "probe" / "h200-spin"
LAB_RUN = REPO / "tests" / "results" / "fixtures" / "run-synthetic-tp8"


def _closed(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others: a reader may meet keys added
    later (the promise), but the toolkit's own output must have no key its schema does not describe."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _validated(text: str, kind: str) -> Any:
    """The envelope printed, checked against docs/schemas/KIND.schema.json as committed (closed: no key it does
    not describe); its data."""
    printed = json.loads(text)
    committed = json.loads((SCHEMAS / f"{kind}.schema.json").read_text())
    jsonschema.Draft202012Validator(_closed(committed)).validate(printed)
    assert printed["kind"] == kind and printed["schema_version"] == SCHEMA_VERSIONS[kind]
    return printed["data"]


def _run(capsys: pytest.CaptureFixture[str], argv: list[str], rc: int = 0) -> str:
    capsys.readouterr()
    assert main(argv) == rc
    return capsys.readouterr().out


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    """The shipped profiles plus one lab entry in glm5-tp8, recorded through `results record --json`."""
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    return tmp_path / "profiles"


def test_committed_schemas_are_the_generated_ones() -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "json_schemas.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_every_kind_has_a_version_a_type_and_a_valid_schema() -> None:
    assert set(SCHEMA_VERSIONS) == set(DATA_TYPES)
    for kind in SCHEMA_VERSIONS:
        jsonschema.Draft202012Validator.check_schema(schema(kind))


def test_every_json_print_in_the_commands_goes_through_the_envelope() -> None:
    """No command prints JSON of its own, and every kind a command emits is a versioned one."""
    emitted: set[str] = set()
    for path in sorted((REPO / "toolkit" / "cli").glob("*.py")):
        if path.name in ("envelope.py", "schemas.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            owner = getattr(node.func, "value", None)
            assert not (name in ("dump", "dumps") and isinstance(owner, ast.Name) and owner.id == "json"
                        and _printed(node, path)), f"{path.name}:{node.lineno} prints JSON outside the envelope"
            if name == "emit" and node.args:
                kinds = [c.value for c in ast.walk(node.args[0]) if isinstance(c, ast.Constant)
                         and isinstance(c.value, str)]
                assert kinds, f"{path.name}:{node.lineno}: emit's kind is not a literal"
                emitted.update(kinds)
    assert emitted <= set(SCHEMA_VERSIONS), emitted - set(SCHEMA_VERSIONS)
    assert set(SCHEMA_VERSIONS) - emitted == {"error"}  # every kind is emitted somewhere; errors by main


def _printed(call: ast.Call, path: Path) -> bool:
    """json.dump to stdout, or json.dumps whose text is printed (not a value passed on, e.g. into a table)."""
    if call.func.attr == "dump":  # type: ignore[attr-defined]
        return True
    text = path.read_text().splitlines()[call.lineno - 1]
    return "print(json.dumps" in text


def test_profile_list(capsys: pytest.CaptureFixture[str], profiles: Path) -> None:
    data = _validated(_run(capsys, ["profile", "list", "--json", "--profiles-dir", str(profiles)]), "profile.list")
    assert {"glm5-baseline", "glm5-tp8"} <= {row["name"] for row in data}
    (profiles / "broken.yaml").write_text("extends: [\n")
    data = _validated(_run(capsys, ["profile", "list", "--json", "--profiles-dir", str(profiles)]), "profile.list")
    assert next(row for row in data if row["name"] == "broken")["error"]


def test_results_record_and_compare(capsys: pytest.CaptureFixture[str], profiles: Path, tmp_path: Path) -> None:
    run = tmp_path / "runs" / "run-synthetic-tp8"
    shutil.copytree(LAB_RUN, run)
    record = _validated(_run(capsys, ["results", "record", str(run), "--profile", "glm5-tp8", "--json",
                                      "--profiles-dir", str(profiles)]), "results.record")
    assert record["action"] == "added" and record["entry"]["run_id"] == record["run_id"]
    data = _validated(_run(capsys, ["results", "compare", "all", "--json", "--profiles-dir", str(profiles)]),
                      "results.compare")
    assert [g["provenance"] for g in data["groups"]] == ["imported", "stand-in"]
    assert data["groups"][1]["ranked"][0]["run_id"] == record["run_id"]


@pytest.mark.parametrize("command", [
    ["profile", "show", "glm5-tp8", "--json"],
    ["profile", "show", "glm5-tp8", "--resolved", "--json"],
    ["profile", "validate", "all", "--json"],
    ["profile", "render", "glm5-tp8", "--json"],
    ["profile", "render", "glm5-tp8", "--only", "argv", "--json"],
    ["profile", "diff", "glm5-baseline", "glm5-tp8", "--json"],
])
def test_profile_commands(capsys: pytest.CaptureFixture[str], profiles: Path, command: list[str]) -> None:
    printed = json.loads(_run(capsys, [*command, "--profiles-dir", str(profiles)]))
    _validated(json.dumps(printed), printed["kind"])
    assert printed["kind"].startswith("profile.")


def test_profile_diff_since(capsys: pytest.CaptureFixture[str]) -> None:
    """Against the repository's own history: each profile changed since the first commit that had profiles."""
    first = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", "profiles/glm5-tp8.yaml"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split()[-1]
    data = _validated(_run(capsys, ["profile", "diff", "--since", first, "--json"]), "profile.changes")
    assert data and any(c["knobs"] for c in data)  # the shipped profiles changed since: knobs with their why


def test_sweep(capsys: pytest.CaptureFixture[str], profiles: Path, tmp_path: Path) -> None:
    """A sweep over the recorded 3 x 2 table (in process, no host)."""
    table = json.loads((REPO / "tests" / "sweep" / "fixtures" / "sweep_3x2_results.json").read_text())
    for point in table["points"]:
        point["duration_s"] = 0.05
    (tmp_path / "table.json").write_text(json.dumps(table))
    argv = ["sweep", "glm5-tp8", "--vary", "server.max_running_requests=256,512,1024", "--vary",
            "server.cuda_graph=on,off", "--concurrency", "64,256", "--runner", f"recorded:{tmp_path / 'table.json'}",
            "--profiles-dir", str(profiles), "--sweeps-dir", str(tmp_path / "sweeps"), "--json"]
    data = _validated(_run(capsys, argv), "sweep")
    assert data["by_throughput"] and data["pareto_front"]


def test_host_facts_and_plan_from_a_recorded_host() -> None:
    """`host facts --json` and `host plan --json` print these objects' to_json through the envelope (a live host
    is a lab test's): the recorded homelab host's facts, and its plan with a two-GPU profile and
    without one."""
    import yaml

    from toolkit.adapters.compat_store import read_matrix
    from toolkit.cli.envelope import envelope
    from toolkit.core.hostplan.facts import parse_facts, raw_from_json
    from toolkit.core.hostplan.plan import ProfileNeeds, make_plan

    raw = yaml.safe_load((REPO / "tests" / "hostplan" / "fixtures" / "pve92-homelab.yaml").read_text())
    facts = parse_facts("pve1", raw_from_json(raw))
    _validated(json.dumps(envelope("host.facts", facts.to_json())), "host.facts")
    needs = ProfileNeeds(name="two-gpus", sglang_version="0.5.23", gpu_count=2, tp_size=2, p2p=False, nnodes=1,
                         model_size_gib=60.0, power_limit_w=300.0)
    plans = [make_plan(facts, read_matrix(), needs, {}, {}), make_plan(facts, read_matrix(), None, {}, {})]
    for plan in plans:
        data = _validated(json.dumps(envelope("host.plan", plan.to_json())), "host.plan")
        assert data["choices"] and data["extravars"]["toolkit_plan_digest"]


def test_probe_replay(capsys: pytest.CaptureFixture[str]) -> None:
    data = _validated(_run(capsys, ["probe", "replay", str(PROBE_RUN), "--json"]), "probe.replay")
    assert data["dir"] == str(PROBE_RUN) and data["verdict"]["class"]


def test_a_refusal_is_the_error_kind_on_stdout(capsys: pytest.CaptureFixture[str], profiles: Path) -> None:
    data = _validated(_run(capsys, ["profile", "show", "nope", "--json", "--profiles-dir", str(profiles)], rc=2),
                      "error")
    assert data["code"] == "bad_input" and data["exit_code"] == 2 and "nope" in data["message"] and data["fix"]
    data = _validated(_run(capsys, ["probe", "replay", str(profiles), "--json"], rc=2), "error")
    assert data["code"] == "bad_input" and data["problems"]


def test_a_refusal_as_a_command_loads_is_the_error_kind_too() -> None:
    # A process of its own: the lab reads TOOLKIT_LAB_INSTANCE once, as its module loads, and in the suite another
    # test has loaded it long before (a monkeypatched variable then changed nothing and the status answered).
    proc = subprocess.run([sys.executable, "-m", "toolkit", "lab", "status", "--json"], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env={**os.environ, "TOOLKIT_LAB_INSTANCE": "bad/instance"})
    assert proc.returncode == 2, proc.stderr
    data = _validated(proc.stdout, "error")
    assert data["field"] == "TOOLKIT_LAB_INSTANCE" and data["fix"]


def test_a_usage_error_is_the_error_kind_too(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["profile", "lst", "--json"])
    assert exit_.value.code == 2
    data = _validated(capsys.readouterr().out, "error")
    assert data["code"] == "usage" and "did you mean list?" in data["message"]
    with pytest.raises(SystemExit):
        main(["profile", "show", "x", "--server-url=http://u:pw0rdpw0rd@10.0.0.2/", "--json"])
    data = _validated(capsys.readouterr().out, "error")
    assert "unrecognized arguments" in data["message"] and "pw0rdpw0rd" not in data["message"]


def test_output_off_its_schema_is_refused() -> None:
    """The contract can fail: a missing key, a wrong kind or another version does not validate."""
    committed = json.loads((SCHEMAS / "results.compare.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(committed)
    good = {"kind": "results.compare", "schema_version": 1, "data": {"groups": [], "no_results": []}}
    validator.validate(good)
    for bad in ({**good, "kind": "results.record"}, {**good, "schema_version": 2},
                {**good, "data": {"groups": []}}):
        assert not validator.is_valid(bad)
    # A key the types do not describe: a reader may meet it (keys are added within a version), but the toolkit's
    # own output is held to its schema closed, so a type and its schema never fall behind what is printed.
    extra = {**good, "data": {**good["data"], "ranked_by": "throughput"}}
    assert validator.is_valid(extra) and not jsonschema.Draft202012Validator(_closed(committed)).is_valid(extra)


def _enveloped(kind: str, data: Any) -> str:
    return json.dumps({"kind": kind, "schema_version": SCHEMA_VERSIONS[kind], "data": data})


def test_apply_and_upgrade_data_validate_against_their_closed_schemas(tmp_path: Path) -> None:
    """What `apply --json` and `upgrade --json` print, built from their outcomes (a deploy needs the lab, which
    tests/apply and tests/upgrade run): every key typed, none left open."""
    from toolkit.adapters.probe_store import read_verdict
    from toolkit.app.apply import ApplyOutcome, HostProbe
    from toolkit.app.upgrade import UpgradeOutcome
    from toolkit.core.ansible_summary import HostStats, PlaybookResult, TaskFailure
    from toolkit.core.provenance import Provenance
    from toolkit.core.upgrade import Run

    result = PlaybookResult(2, "failed", {"gpu1": HostStats(ok=9, changed=2), "gpu2": HostStats(failed=1)},
                            [TaskFailure("gpu2", "sglang : health", "timed out")], None)
    outcome = ApplyOutcome("glm5-tp8", False, result, ["a note"], tmp_path,
                           probes={"gpu1": HostProbe(LAB_RUN, read_verdict(LAB_RUN)),
                                   "gpu2": HostProbe(tmp_path / "none", None)},
                           record={"recorded": {"gpu1": "added in glm5-tp8.yaml"}})
    data = _validated(_enveloped("apply", outcome.summary), "apply")
    assert data["probe"]["gpu1"]["verdict"]["provenance"]["kind"] == "stand-in"

    lab = Provenance("stand-in", "lab")
    up = UpgradeOutcome("refused", "glm5-tp8", "glm5-tp8-0.5.10", "0.5.9", "0.5.10", "slower",
                        [Run("old", 1000.0, "runs/a", True, 10.0, provenance=lab),
                         Run("new", float("nan"), None, None, 2.0, "the unit failed")],
                        report="runs/u/report.md", wall_s=30.0,
                        data={"decision": "refused", "profile": "glm5-tp8", "new_profile": "glm5-tp8-0.5.10",
                              "from_version": "0.5.9", "to_version": "0.5.10", "objective": "throughput",
                              "effect_pct": 3.0, "accept_equal": False, "text": "slower", "pairs": 1,
                              "change": None, "change_99": None, "outcome": None, "rollback_s": 4.2, "slo": None,
                              "slo_definition": None, "slo_text": None})
    data = _validated(_enveloped("upgrade", up.to_dict()), "upgrade")
    assert [r["mark"] for r in data["runs"]] == ["LAB STAND-IN", None]


def test_tune_data_validates_against_its_closed_schema() -> None:
    """What `tune --json` prints (and tune.json holds), of a tune over the lab's engine model: its steps, noise band
    and stop typed by the tune's record (toolkit.core.tune.log), nothing left open."""
    from tests.tune.conftest import BASE, fresh, tune
    from toolkit.adapters.profile_store import ProfileStore
    from toolkit.core.tune import report
    from toolkit.lab.engine_runner import EngineModelRunner

    profiles = ProfileStore(REPO / "profiles")
    state, spec = fresh(profiles)
    tune(profiles, state, spec, EngineModelRunner(base=BASE, profile_names=profiles.names()))
    data = _validated(_enveloped("tune", report.to_json(state)), "tune")
    assert data["stop"]["kind"] and len(data["steps"]) >= 2 and data["noise"]["band_pct"] >= 1.0


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "profiles").glob("*.yaml")))
def test_every_shipped_profile_shows_as_its_schema_says(capsys: pytest.CaptureFixture[str], profiles: Path,
                                                        name: str) -> None:
    """profile.show and profile.resolved carry the profile model's own schema: each shipped profile (replicas, hosts,
    results blocks) as written and as resolved."""
    shown = _validated(_run(capsys, ["profile", "show", name, "--json", "--profiles-dir", str(profiles)]),
                       "profile.show")
    assert shown["name"] == name
    resolved = _validated(_run(capsys, ["profile", "show", name, "--resolved", "--json", "--profiles-dir",
                                        str(profiles)]), "profile.resolved")
    assert resolved["spec"]["name"] == name and resolved["chain"][0] == name

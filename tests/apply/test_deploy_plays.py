"""deploy.yml's plays as Ansible itself resolves them for each kind of deploy (`ansible-playbook --list-hosts`,
no host contacted): one host's deploy unchanged, node ranks in one play, a rolling change in the serial play only,
the router's play last on its host alone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def plays(tmp_path: Path, extravars: dict) -> dict[str, list[str]]:
    inv = tmp_path / "inventory.yml"
    inv.write_text("all:\n  children:\n    gpu_containers:\n      hosts:\n        gpu-a: {}\n        gpu-b: {}\n"
                   "        gpu-c: {}\n")
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), str(REPO / "playbooks/deploy.yml"), "-i", str(inv),
         "--list-hosts", "-e", json.dumps(extravars)],
        capture_output=True, text=True, check=True, timeout=120,
        env={**os.environ, "ANSIBLE_ROLES_PATH": str(REPO / "roles")}).stdout
    found: dict[str, list[str]] = {}
    for block in re.split(r"\n\s*play #\d+ ", out)[1:]:
        name = block.split(":", 1)[1].split("\tTAGS")[0].strip()
        listed = block.split("hosts (", 1)[1].splitlines()[1:]
        found[name] = [h.strip() for h in listed if h.strip()]
    return found


@pytest.mark.parametrize(("extravars", "expected"), [
    ({}, {"Deploy the SGLang service": ["gpu-a", "gpu-b", "gpu-c"],
          "Roll the change over the replicas, one at a time": [],
          "SGLang's router in front of the replicas, once each answers": [],
          "Measure it (benchmark plus GPU sampling)": ["gpu-a", "gpu-b", "gpu-c"]}),
    ({"deploy_hosts": ["gpu-a", "gpu-b"], "deploy_probe_hosts": ["gpu-a"]},
     {"Deploy the SGLang service": ["gpu-a", "gpu-b"], "Roll the change over the replicas, one at a time": [],
      "Measure it (benchmark plus GPU sampling)": ["gpu-a"]}),
    ({"deploy_hosts": ["gpu-a", "gpu-b"], "deploy_rolling": True, "deploy_router_host": ["gpu-a"],
      "deploy_probe_hosts": ["gpu-a"]},
     {"Deploy the SGLang service": [], "Roll the change over the replicas, one at a time": ["gpu-a", "gpu-b"],
      "SGLang's router in front of the replicas, once each answers": ["gpu-a"]}),
])
def test_each_kind_of_deploy_runs_the_plays_it_needs(tmp_path: Path, extravars: dict, expected: dict) -> None:
    found = plays(tmp_path, extravars)
    assert list(found)[-2:] == ["SGLang's router in front of the replicas, once each answers",
                                "Measure it (benchmark plus GPU sampling)"]  # the router after every backend
    for play, hosts in expected.items():
        assert sorted(found[play]) == sorted(hosts), (play, found[play])

#!/usr/bin/env bash
# Today's strict lab and container tests against the container roles of an older commit: which findings of
# the roles review (docs/provision.md) each test catches ("each finding as a lab test that fails on the
# old roles and passes on the fixed ones").
#
#     bash benchmarks/old_roles_strict.sh [REV]          # default 5bba2c6^, the roles before the strict-lab fixes
#     bash benchmarks/old_roles_strict.sh - deploy       # HEAD with only the fixes of findings 7 and 18 undone
#     bash benchmarks/old_roles_strict.sh 0895aed round2 # the second review's tests against the roles before them
#     bash benchmarks/old_roles_strict.sh 0895aed alone vfio_pci pending  # one homelab test on a fresh host (below)
#
# TOOLKIT_LAB_INSTANCE picks the lab instance (defaults: o14, o30 for round2 and alone), so runs on different
# instances do not collide; each has its own worktree under /tmp.
#
# The old container roles stop at finding 6 (no python3-venv) before the deploy's findings are reached, and
# REV's whole deploy roles fail today's tests for reasons of their own (the engine-model stand-in, the server
# timeline came later). So `deploy` undoes exactly those two fixes on HEAD (benchmarks/undo_findings_7_18.patch:
# HF_HOME back to /var/cache/huggingface for the download and unset in the unit and the probe; no JIT check)
# and runs the tests that assert them.
#
# A detached worktree of HEAD under /tmp gets roles/{lxc_gpu_container,container_nvidia_userspace,sglang_venv,
# sglang_service,bench_probe} from REV; files added since stay, but REV's tasks never include them. REV's pinned
# template (debian-12-standard_12.7-1, no longer in Proxmox's index: finding 12, which stops everything else) is
# replaced by the current one, as its own fix message tells a user to, so the later findings are reached. The
# tests run on lab instance o14 (its own namespace and containers), the host role first, as in the suite.
# Commit first: the worktree is HEAD's.
set -euo pipefail
rev=${1:-5bba2c6^}
mode=${2:-container}
repo=$(cd "$(dirname "$0")/.." && pwd)
instance=${TOOLKIT_LAB_INSTANCE:-}
wt=/tmp/toolkit-old-roles${instance:+-$instance}
git -C "$repo" worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
git -C "$repo" worktree add -q --detach "$wt" HEAD
trap 'git -C "$repo" worktree remove --force "$wt"' EXIT
cd "$wt"
if [ "$mode" = round2 ] || [ "$mode" = alone ]; then
  # The roles, playbooks and the reproduce use case of REV (it ran no storage preflight play); today's lab and
  # tests. Stage A: the old roles as they are, on the homelab flavour and on the strict container tests.
  # Stage B: the homelab module again with what a user of the old roles does by hand once they stop (the
  # enterprise repositories switched to no-subscription, NVIDIA's cuda-keyring installed, the root
  # filesystem's storage named: findings 1, 6 and 3 stop them before anything else), so the later findings are
  # reached. Each stage prints the tests' outcomes and their first failures.
  git checkout -q "$rev" -- roles playbooks toolkit/app/host.py
  rm -f playbooks/containers_preflight.yml
  ln -s "$repo/.venv" .venv
  export PYTHONPATH=$wt TOOLKIT_SHARE_DIR=$wt TOOLKIT_LAB_INSTANCE=${TOOLKIT_LAB_INSTANCE:-o30}
  # Each test's outcome and the first line of its failure (the short summary of -rA; CI=true keeps pytest from
  # cutting the failure off at the terminal's width); each stage's whole output stays in $logs.
  export CI=true
  logs=${TOOLKIT_OLD_ROLES_LOGS:-/tmp/old-roles-round2}
  mkdir -p "$logs"
  report() { tee "$logs/$1.log" | grep -E "^(PASSED|FAILED|ERROR) |^=+ .*(passed|failed)" | cut -c1-700 || true; }
  # Stage B's (and alone's) hand fixes of a user of the old roles, once findings 1, 6 and 3 stopped them.
  prepare_pve1="sed -i 's|^deb https://enterprise|# deb https://enterprise|' /etc/apt/sources.list.d/*.list && \
echo 'deb http://download.proxmox.com/debian/pve bookworm pve-no-subscription' > /etc/apt/sources.list.d/pve-no-subscription.list && \
curl -sfo /tmp/k.deb https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb && \
dpkg -i /tmp/k.deb >/dev/null"
  extravars='{"lxc_gpu_container_rootfs_storage": "local-zfs"}'
  stages=${3:-AB}  # `round2 B`: stage B alone; TOOLKIT_OLD_ROLES_K: pytest -k for the homelab module
  [ "$mode" = round2 ] || stages=""
  k=(-k "${TOOLKIT_OLD_ROLES_K:-not nothing}")
  if [[ $stages == *A* ]]; then
    echo "== stage A: the roles of $rev"
    { .venv/bin/python -m pytest -p no:cacheprovider -rA -q --tb=short "${k[@]}" tests/provision/test_homelab_lab.py 2>&1 || true; } | report A-homelab
    { .venv/bin/python -m pytest -p no:cacheprovider -rA -q --tb=short \
    "tests/provision/test_provision_lab.py::test_host_role_from_scratch_then_no_change" \
    "tests/provision/test_container_strict_lab.py::test_raw_passthrough_allows_only_the_gpus_asked_for" \
    "tests/provision/test_container_strict_lab.py::test_an_adopted_container_keeps_its_own_net0" \
    "tests/provision/test_container_strict_lab.py::test_a_model_cache_on_the_small_root_stops_the_reproduce_before_anything" \
      2>&1 || true; } | report A-strict
  fi
  if [ "$mode" = alone ]; then
    # `alone KEYWORD`: the homelab module's tests matching KEYWORD on a fresh homelab host (the module's fixture
    # brings one up and takes it down), so no earlier test's failure decides what they see. Before them, with
    # stage B's hand fixes: the old roles' own `toolkit host reproduce` (the state the module's later tests
    # start from, without the reproduce test's reboot), then the commands in TOOLKIT_OLD_ROLES_THEN on pve1
    # (one a line) and, with TOOLKIT_OLD_ROLES_REBOOT=1, `toolkit lab reboot pve1`. TOOLKIT_OLD_ROLES_DROP: the
    # lines of the module holding that text become `pass` (an earlier finding's assertion that would stop a test
    # before its own checks; say so where the result is quoted). After them, pve1's state
    # (kernel, DKMS, the container and its HA resource, its devices, the host plays' task outcomes) for
    # what a failed assertion hides.
    python3 - "$wt/tests/provision/test_homelab_lab.py" "$wt/tests/provision/test_old_roles_alone.py" <<'PY'
import os
import sys
from pathlib import Path
module = Path(sys.argv[1]).read_text()
prep = '''
def test_old_roles_prep(stock: LabState) -> None:
    reproduce(stock, "the old roles")
    for command in filter(None, os.environ.get("TOOLKIT_OLD_ROLES_THEN", "").splitlines()):
        pve(stock, command)
    if os.environ.get("TOOLKIT_OLD_ROLES_REBOOT") == "1":
        reboot(stock)
    print(pve(stock, "uname -r; dkms status; pct status 100", ok=False))


'''
state = '''

def test_old_roles_zz_state(stock: LabState, runs: Path) -> None:
    print(pve(stock, "uname -r; dkms status; pct status 100; ha-manager status; ha-manager config; "
                     "grep -E '^(dev|lxc)' /etc/pve/lxc/100.conf; ls /dev/nvidia*; systemctl --failed --no-legend; "
                     "cat /etc/modprobe.d/*nvidia* 2>/dev/null; grep -m3 'module type' /var/log/nvidia-installer.log",
              ok=False))
    for stdout in sorted(runs.glob("artifacts/*/stdout"), key=lambda p: p.stat().st_mtime):
        lines = re.sub(r"\\x1b\\[[0-9;]*m|\\r", "", stdout.read_text(errors="replace")).splitlines()
        print(f"== {stdout.parent.name}:", *[x for x in lines if x.startswith(("TASK", "changed", "fatal", "failed",
                                                                             "PLAY RECAP", "pve1 "))], sep="\\n")
'''
drop = os.environ.get("TOOLKIT_OLD_ROLES_DROP", "")
if drop:  # an assertion of an earlier finding that stops a test before the checks of its own
    assert drop in module, drop
    module = "\n".join(line[:len(line) - len(line.lstrip())] + "pass  # dropped by old_roles_strict.sh"
                        if drop in line else line for line in module.splitlines()) + "\n"
at = module.index("def test_homelab_is_bare_and_its_tools_refuse_as_the_real_ones")
Path(sys.argv[2]).write_text(module[:at] + prep + module[at:] + state)
PY
    if [ "${4:-}" = pending ]; then  # finding 4's hand fix, for the tests that reboot: the kernel waiting, booted
      export TOOLKIT_OLD_ROLES_THEN=$'apt-get install -y proxmox-headers-6.8.12-11-pve\ndkms autoinstall -k 6.8.12-11-pve'
      export TOOLKIT_OLD_ROLES_REBOOT=1
    fi
    TOOLKIT_LAB_INSTANCE=$TOOLKIT_LAB_INSTANCE .venv/bin/toolkit lab down >/dev/null 2>&1 || true
    echo "== alone: the roles of $rev, stage B's hand fixes, on a fresh host: $3"
    TOOLKIT_TEST_PREPARE_PVE1=$prepare_pve1 TOOLKIT_TEST_EXTRAVARS=$extravars \
      .venv/bin/python -m pytest -p no:cacheprovider -rA -q --tb=short -s \
      -k "old_roles_prep or ($3) or old_roles_zz" tests/provision/test_old_roles_alone.py 2>&1 \
      | report "alone-$TOOLKIT_LAB_INSTANCE-${3//[^a-z0-9_]/_}" || true
    exit 0
  fi
  [[ $stages == *B* ]] || exit 0
  echo "== stage B: the roles of $rev, with a user's workarounds for findings 1, 6 and 3"
  TOOLKIT_TEST_PREPARE_PVE1=$prepare_pve1 TOOLKIT_TEST_EXTRAVARS=$extravars \
    .venv/bin/python -m pytest -p no:cacheprovider -rA -q --tb=short "${k[@]}" tests/provision/test_homelab_lab.py 2>&1 \
    | report B-homelab || true
  exit 0
fi
if [ "$mode" = deploy ]; then
  git apply --3way "$repo/benchmarks/undo_findings_7_18.patch"
  ln -s "$repo/.venv" .venv
  export PYTHONPATH=$wt TOOLKIT_SHARE_DIR=$wt TOOLKIT_LAB_INSTANCE=${TOOLKIT_LAB_INSTANCE:-o14}
  .venv/bin/python -m pytest -p no:cacheprovider -q --tb=line -rfE \
    "tests/apply/test_apply_lab.py::test_apply_from_scratch_probe_and_record" \
    "tests/apply/test_apply_faults_lab.py::test_no_c_compiler_fails_the_deploy_at_its_jit_check_not_the_first_request" \
    "tests/apply/test_sglang_venv_role.py::test_install_patch_idempotent_and_refuse_wrong_sha" || true
  exit 0
fi
git checkout -q "$rev" -- roles/lxc_gpu_container roles/container_nvidia_userspace roles/sglang_venv \
  roles/sglang_service roles/bench_probe
template=$(PYTHONPATH=$wt python3 -c "from toolkit.lab.plan import TEMPLATE_NAME; print(TEMPLATE_NAME)")
sed -i "s|^lxc_gpu_container_template: .*|lxc_gpu_container_template: local:vztmpl/$template|" \
  roles/lxc_gpu_container/defaults/main.yml
cat > tests/provision/test_old_roles_prep.py <<EOF
def test_the_current_template_is_on_pve1(lab):  # what finding 12's fix message asks of the user
    proc = lab.ssh("pve1", "test -f /var/lib/vz/template/cache/$template || pveam download local $template")
    assert proc.returncode == 0, proc.stderr
EOF
ln -s "$repo/.venv" .venv
export PYTHONPATH=$wt TOOLKIT_SHARE_DIR=$wt TOOLKIT_LAB_INSTANCE=${TOOLKIT_LAB_INSTANCE:-o14}
.venv/bin/python -m pytest -p no:cacheprovider -rA -q tests/provision/test_old_roles_prep.py \
  "tests/provision/test_provision_lab.py::test_host_role_from_scratch_then_no_change" \
  "tests/provision/test_provision_lab.py::test_container_roles_then_no_change" \
  "tests/provision/test_provision_lab.py::test_bad_input_stops_before_any_change" \
  tests/provision/test_container_strict_lab.py \
  "tests/apply/test_apply_lab.py::test_apply_from_scratch_probe_and_record" | grep -E "^(PASSED|FAILED|ERROR)|^E  .*(Error|failed ct|assert)|passed|failed" || true

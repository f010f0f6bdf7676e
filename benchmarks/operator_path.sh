#!/usr/bin/env bash
# The operator's path of docs/provision.md ("Bring your own host"), walked against a lab standing in for the
# host: a stock Proxmox VE 9 pve1 (`toolkit lab up --flavour stock-pve9`), with inventory/real-host.example.yml
# filled in as an operator fills it, plus only the lab-only variables docs/lab.md names ("The lab's inventory").
# Each step is timed (bash SECONDS, wall clock); a table of the steps closes the run.
#
#     TOOLKIT_LAB_INSTANCE=h3 bash benchmarks/operator_path.sh [PROFILE]     # default glm5-tp8
#
# The lab instance is required (1-4 characters), so a run never takes the default lab. The lab is taken down
# and brought up fresh (a stock host as installed), and left up at the end for a look (`toolkit lab down`).
# The profiles are a copy (the apply's --record writes there), the inventory and the host key file are in a
# temporary directory: nothing in the checkout changes.
set -uo pipefail
profile=${1:-glm5-tp8}
instance=${TOOLKIT_LAB_INSTANCE:?set TOOLKIT_LAB_INSTANCE to your lab instance (1-4 characters)}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
toolkit=(.venv/bin/toolkit)
work=$(mktemp -d /tmp/operator-path.XXXXXX)
inv=$work/pve1.yml
lab_state=/var/lib/toolkit-lab-$instance
steps=()

step() {  # step NAME COMMAND...: run it, time it, record the row; stop the walk at the first failure
  local name=$1; shift
  echo "== $name: $*" >&2
  local start=$SECONDS rc=0
  "$@" >"$work/step-${#steps[@]}.log" 2>&1 || rc=$?
  local took=$((SECONDS - start))
  steps+=("$name|$took|$rc|$*")
  tail -n 4 "$work/step-$((${#steps[@]} - 1)).log" | sed 's/^/   /' >&2
  if [ "$rc" != 0 ]; then
    echo "   FAILED (exit $rc): log $work/step-$((${#steps[@]} - 1)).log" >&2
    table
    exit "$rc"
  fi
}

table() {
  echo
  echo "| # | step | command | wall (s) | exit |"
  echo "|---|---|---|---|---|"
  local i=1 row name took rc cmd
  for row in "${steps[@]}"; do
    IFS='|' read -r name took rc cmd <<<"$row"
    echo "| $i | $name | \`${cmd//$work/\$WORK}\` | $took | $rc |"
    i=$((i + 1))
  done
  echo
  echo "(lab instance $instance, flavour stock-pve9, profile $profile; \$WORK = $work)"
}

# The inventory an operator writes from the example (docs/provision.md step 2): the REQUIRED values filled in with
# the lab's (the key `toolkit lab up` made, pve1's and the container's addresses, the installer's sha256, which
# the lab's mirror serves at NVIDIA's URL), pve1's key pinned in this run's own known_hosts (step 3), and the
# lab-only variables of docs/lab.md, each marked.
write_inventory() {
  ssh-keyscan -H "$(.venv/bin/python - "$lab_state/lab.yml" <<'EOF'
import sys, yaml
print(yaml.safe_load(open(sys.argv[1]))["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"]["ansible_host"])
EOF
)" >"$work/known_hosts" 2>/dev/null
  .venv/bin/python - inventory/real-host.example.yml "$lab_state/lab.yml" "$inv" "$work/known_hosts" <<'EOF'
import sys, yaml
example, lab_file, out, known = sys.argv[1:]
inv, lab = yaml.safe_load(open(example)), yaml.safe_load(open(lab_file))
lab_pve1 = lab["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"]
lab_ct = next(iter(lab["all"]["children"]["gpu_containers"]["hosts"].values()))
version = lab_pve1["proxmox_gpu_host_driver_version"]
inv["all"]["vars"]["ansible_ssh_private_key_file"] = lab["all"]["vars"]["ansible_ssh_private_key_file"]
pve1 = inv["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"]
pve1.update(ansible_host=lab_pve1["ansible_host"], proxmox_gpu_host_driver_version=version,
            proxmox_gpu_host_driver_checksum=lab_pve1["toolkit_lab_driver_checksums"][version],
            ansible_ssh_common_args=f"-o UserKnownHostsFile={known}")
ct = inv["all"]["children"]["gpu_containers"]["hosts"]["sglang-ct"]
ct.update(ansible_host=lab_ct["ansible_host"], lxc_gpu_container_net0=lab_ct["lxc_gpu_container_net0"],
          lxc_gpu_container_address=lab_ct["ansible_host"])
# LAB ONLY (docs/lab.md, "The lab's inventory"): the stand-ins' paths, no CUDA repository, no Hugging Face, the
# stand-in server's short health wait, and the lab's deploy overlay.
pve1.update({k: lab_pve1[k] for k in ("proxmox_gpu_host_proc_devices", "proxmox_gpu_host_sys_module_dir",
                                      "proxmox_gpu_host_lspci_command")})
inv["all"]["children"]["gpu_containers"]["vars"].update(
    container_nvidia_userspace_cuda_install_method="none", sglang_venv_model_fetch=False,
    sglang_service_health_timeout_s=20)
inv["all"]["vars"]["toolkit_overlay"] = "lab"
open(out, "w").write(yaml.safe_dump(inv, sort_keys=False))
EOF
}

cp -r profiles "$work/profiles"
TOOLKIT_LAB_INSTANCE=$instance "${toolkit[@]}" lab down >/dev/null 2>&1 || true
step "the server (lab: a stock PVE 9 host)" env TOOLKIT_LAB_INSTANCE="$instance" "${toolkit[@]}" lab up --flavour stock-pve9
step "write the inventory, trust pve1's key" write_inventory
step "plan" "${toolkit[@]}" host provision pve1 -i "$inv" --check --diff
step "provision the host" "${toolkit[@]}" host provision pve1 -i "$inv"
step "make the container" "${toolkit[@]}" host provision pve1 -i "$inv" --containers --profile "$profile"
step "check" "${toolkit[@]}" doctor pve1 -i "$inv"
step "deploy and measure" "${toolkit[@]}" apply profile "$profile" -i "$inv" --probe --record \
  --profiles-dir "$work/profiles" --runs-dir "$work/runs"
step "report" "${toolkit[@]}" report "$profile" --profiles-dir "$work/profiles" --html "$work/report.html"
step "re-run (nothing to change)" "${toolkit[@]}" host provision pve1 -i "$inv" --containers --profile "$profile"
table

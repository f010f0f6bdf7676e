"""`toolkit lab up|status|ssh|down`: thin commands over toolkit.lab."""

from __future__ import annotations

import argparse
import json
import os
import time

from toolkit.cli.envelope import emit
from toolkit.lab import plan


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="lab_command", metavar="SUBCOMMAND")
    p_up = sub.add_parser("up", help="build (or check) pve1 and its network; write inventory/lab.yml",
                            description="build (or check) pve1 and its network; write inventory/lab.yml")
    p_up.add_argument("--gpus", type=int, default=8, help="stand-in GPUs on pve1 (default 8, as the story's host)")
    p_up.add_argument("--driver-version", default=plan.DEFAULT_DRIVER_VERSION,
                      help=f"version the stand-in driver reports (default {plan.DEFAULT_DRIVER_VERSION})")
    p_up.add_argument("--subnet", default=plan.DEFAULT_SUBNET, help="controller <-> pve1 network")
    p_up.add_argument("--ct-subnet", default=plan.DEFAULT_CT_SUBNET, help="pve1's container bridge network")
    p_up.add_argument("--ct-vmid", type=int, default=plan.DEFAULT_CT_VMID, help="vmid the inventory's `ct` gets")
    p_up.add_argument("--flavour", default="lab", choices=sorted(plan.FLAVOURS),
                      help="what pve1 is before the roles run: lab (default); a stock Proxmox VE host, subscribed "
                           "(stock-pve8, stock-pve9: no build tools or headers, nouveau bound, a stand-in Proxmox "
                           "kernel, a package mirror); or homelab (PVE 8 without a subscription, ZFS root, a newer "
                           "kernel installed but not booted)")
    p_up.add_argument("--secure-boot", action="store_true",
                      help="stock flavours: Secure Boot on (unsigned modules refused)")
    p_up.add_argument("--nvswitches", type=int, default=0, help="stock flavours: NVSwitch bridges on the PCI bus (HGX)")
    p_up.add_argument("--extra-driver-version", action="append", default=[], metavar="VERSION",
                      help="stock flavours: another driver version the mirror serves (to test an upgrade)")
    p_up.add_argument("--gpu-model", default=plan.DEFAULT_GPU_MODEL, choices=sorted(plan.GPU_MODELS),
                      help=f"stock flavours: the GPUs' model (default {plan.DEFAULT_GPU_MODEL}; p40 is a pre-Turing "
                           "GPU the open kernel modules do not drive)")
    p_up.add_argument("--vfio-gpus", type=int, default=0,
                      help="stock flavours: how many GPUs (the last ones) are bound to vfio-pci, passed to VMs")
    p_up.add_argument("--kernel", default="", metavar="SERIES", dest="kernel_series",
                      help="stock-pve9: the default kernel's series, 7.0 (a Proxmox VE 9.2 host; the stand-in "
                           "module builds only from 580.142 there)")
    p_up.add_argument("--apt-driver", action="store_true",
                      help="stock flavours: a driver already installed from Debian's packages (dpkg lists them; "
                           "NVIDIA's .run installer refuses to run over them)")
    p_up.add_argument("--vm-gpus", type=int, default=0,
                      help="stock flavours: how many GPUs (the last ones the host keeps) a stopped VM names in its "
                           "hostpci lines while nvidia still binds them")
    p_up.add_argument("--disk-gib", type=int, default=plan.DEFAULT_DISK_GIB,
                      help=f"the disk Proxmox's installer carved the storages from (default {plan.DEFAULT_DISK_GIB})")
    p_up.add_argument("--hosts", type=int, default=1,
                      help=f"Proxmox hosts on one LAN, pve1..pveN, each with its GPUs and a container (default 1, "
                           f"at most {plan.MAX_HOSTS}); --flavour and the GPU options apply to each")
    p_up.add_argument("--cluster", action="store_true",
                      help="the hosts form one Proxmox cluster: /etc/pve/nodes shared, a vmid unique across it")
    p_up.add_argument("--clock-skew-ms", action="append", default=[], metavar="HOST=MS",
                      help="set HOST's clock MS ms ahead (negative: behind) of the controller's, e.g. pve2=250: "
                           "what every process of that host reads (a preloaded shim; its containers keep true time)")
    p_up.add_argument("--json", action="store_true", help="print the lab state as JSON")
    p_up.set_defaults(func=cmd_up)
    p_wh = sub.add_parser("wheelhouse", help="fill the wheelhouse a lab apply of PROFILE installs from (no lab needed)",
                          description="fill the wheelhouse a lab apply of PROFILE installs from: the lab lock's real "
                                      "wheels downloaded into the cache (hash-checked), its stand-ins built, the "
                                      "probe's wheels; an apply then finds them there (one that starts first waits "
                                      "for this one). Needs no lab up: scripts/demo runs it beside `lab up`")
    p_wh.add_argument("profile", help="the profile a lab apply will deploy, e.g. glm5-tp8")
    p_wh.add_argument("--profiles-dir", help="directory of profiles (default: TOOLKIT_PROFILES_DIR or ./profiles)")
    p_wh.set_defaults(func=cmd_wheelhouse)
    p_reboot = sub.add_parser("reboot", help="restart a host as a reboot would (units, modules, onboot containers)",
                            description="restart a host as a reboot would (units, modules, onboot containers)")
    p_reboot.add_argument("host", nargs="?", default=plan.HOSTNAME, help="the host to reboot (default pve1)")
    p_reboot.add_argument("--json", action="store_true", help="print the seconds and failed units as JSON")
    p_reboot.set_defaults(func=cmd_reboot)
    p_status = sub.add_parser("status", help="what of the lab runs (pve1, its containers, leftovers)",
                            description="what of the lab runs (pve1, its containers, leftovers)")
    p_status.add_argument("host", nargs="?", default="", help="only this host (pve1, pve2, ...; default all)")
    p_status.add_argument("--json", action="store_true", help="print the lab state as JSON")
    p_status.set_defaults(func=cmd_status)
    p_ssh = sub.add_parser("ssh", help="SSH to a host (pve1, pve2, ...) or a container (ct, ct2, ...) with the "
                                       "lab's key",
                            description="SSH to a host (pve1, pve2, ...) or a container (ct, ct2, ...) with the "
                                        "lab's key")
    p_ssh.add_argument("host", help="pve1 (the Proxmox-host stand-in), ct (its container); pveN, ctN with --hosts N")
    p_ssh.add_argument("command", nargs=argparse.REMAINDER, help="command to run (default: a login shell)")
    p_ssh.set_defaults(func=cmd_ssh)
    p_down = sub.add_parser("down", help="remove exactly what up made (the cache stays)",
                            description="remove exactly what up made (the cache stays)")
    p_down.add_argument("host", nargs="?", default="",
                        help="power off only this host (its process tree; the rest stays up until a full down)")
    p_down.add_argument("--purge-cache", action="store_true",
                        help="also remove the cached Debian userland and the lab's SSH key")
    p_down.set_defaults(func=cmd_down)


def _progress_console():  # type: ignore[no-untyped-def]
    from rich.console import Console

    return Console(stderr=True)


def cmd_up(args: argparse.Namespace) -> int:
    import toolkit.lab as lab

    config = plan.LabConfig(gpus=args.gpus, driver_version=args.driver_version, subnet=args.subnet,
                            ct_subnet=args.ct_subnet, ct_vmid=args.ct_vmid, flavour=args.flavour,
                            secure_boot=args.secure_boot, nvswitches=args.nvswitches,
                            extra_driver_versions=tuple(args.extra_driver_version), gpu_model=args.gpu_model,
                            vfio_gpus=args.vfio_gpus, disk_gib=args.disk_gib, kernel_series=args.kernel_series,
                            apt_driver=args.apt_driver, vm_gpus=args.vm_gpus, hosts=args.hosts, cluster=args.cluster,
                            clock_skew_ms=plan.parse_clock_skew(args.clock_skew_ms))
    console = _progress_console()
    t0 = time.monotonic()
    with console.status("lab up") as spinner:
        def progress(message: str) -> None:
            console.log(message)
            spinner.update(message)

        state = lab.up(config=config, progress=progress)
    duration_s = time.monotonic() - t0
    if args.json:
        emit("lab.state", json.loads(state.to_json()))
    else:
        where = ", ".join(f"{h.name} at {h.address}" for h in state.config.lab_hosts)
        console.print(f"[green]lab up[/green] in {duration_s:.1f} s: {where}, "
                      f"inventory {state.inventory_path}\n  next: `toolkit lab ssh pve1`, or run the roles "
                      f"with -i {state.inventory_path}")
    return 0


def cmd_wheelhouse(args: argparse.Namespace) -> int:
    from toolkit.lab import deploy_overlay

    console = _progress_console()
    t0 = time.monotonic()
    with console.status(f"lab wheelhouse for {args.profile}"):
        lock_file, lab = deploy_overlay.prefill(args.profile, args.profiles_dir)
    what = (f"{len(lab.real)} real wheel(s), {len(lab.standins)} stand-in(s)" if lab is not None else "the lock whole")
    console.print(f"[green]lab wheelhouse[/green] for {args.profile} in {time.monotonic() - t0:.1f} s: {what} "
                  f"({lock_file})")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    import toolkit.lab as lab
    from toolkit.lab import system

    state = lab.status()
    leftovers = system.leftovers() if os.geteuid() == 0 else []
    if args.json:
        data = json.loads(state.to_json()) if state else {"running": False}
        data["leftovers"] = leftovers if not (state and state.running) else []
        emit("lab.state", data)
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="toolkit lab")
    for col in ("part", "what", "state"):
        table.add_column(col)
    if state is None:
        table.add_row("lab", "never brought up (or taken down)", "down")
        for item in leftovers:
            table.add_row("leftover", item, "[red]present: run `toolkit lab down`[/red]")
        console.print(table)
        return 0
    c = state.config
    hosts = [c.lab_host(args.host)] if args.host else c.lab_hosts
    netns = plan.NETNS if c.hosts == 1 else f"{plan.LAN_NETNS} (the LAN) and one a host"
    table.add_row("network", f"netns {netns}, veth {plan.HOST_VETH}, {c.subnet}; bridge {plan.BRIDGE} "
                             f"{', '.join(h.ct_subnet for h in hosts)}", "")
    table.add_row("GPUs", f"{c.gpus} stand-in per host, driver {c.driver_version}", "")
    table.add_row("inventory", state.inventory_path, "")
    for h in hosts:
        pid, ticks = state.holder(h.name)
        up = system.alive(pid, ticks)
        skew = f", clock {h.clock_skew_ms:+d} ms" if h.clock_skew_ms else ""
        table.add_row(h.name, f"root@{h.address}, pid {pid}{skew}",
                      "[green]running[/green]" if up else "[red]not running[/red]")
        if not up:
            continue
        listing = state.ssh(h.name, "pct list", timeout_s=15)
        for line in listing.stdout.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 2:
                table.add_row(f"{h.name} CT {parts[0]}", parts[-1] if len(parts) > 2 else "", parts[1])
        ct = state.ssh(h.ct_name, "true", timeout_s=8)
        table.add_row(h.ct_name, f"root@{h.ct_address}",
                      "answers over SSH" if ct.returncode == 0 else "not answering (made by the roles)")
    console.print(table)
    return 0


def cmd_ssh(args: argparse.Namespace) -> int:
    import toolkit.lab as lab
    from toolkit.core.errors import ToolkitError

    state = lab.status()
    if state is None or not state.running:
        raise ToolkitError.of("the lab is not up", fix="`toolkit lab up`")
    argv = state.ssh_args(args.host)
    if args.command:
        argv = [*argv, *args.command]
    else:
        argv.insert(1, "-t")
    os.execvp(argv[0], argv)
    return 0  # not reached


def cmd_reboot(args: argparse.Namespace) -> int:
    from toolkit.core.errors import EXIT_FAILED
    from toolkit.lab import system

    console = _progress_console()
    with console.status("lab reboot") as spinner:
        def progress(message: str) -> None:
            console.log(message)
            spinner.update(message)

        _state, duration_s, failed = system.reboot(progress=progress, host=args.host)
    if args.json:
        # `systemctl --failed --plain`: one unit a line, its name first, its description last.
        units = [line.split()[0] for line in failed.splitlines() if line.strip()]
        emit("lab.reboot", {"duration_s": round(duration_s, 1), "failed_units": units})
    else:
        console.print(f"[green]{args.host} rebooted[/green] in {duration_s:.1f} s" +
                      (f"; [red]failed units[/red]:\n{failed}" if failed else ""))
    return EXIT_FAILED if failed else 0


def cmd_down(args: argparse.Namespace) -> int:
    import toolkit.lab as lab

    console = _progress_console()
    t0 = time.monotonic()
    with console.status("lab down") as spinner:
        def progress(message: str) -> None:
            console.log(message)
            spinner.update(message)

        if args.host:
            from toolkit.lab import system

            system.power_off(args.host, progress=progress)
        else:
            lab.down(purge_cache=args.purge_cache, progress=progress)
    console.print(f"[green]{args.host or 'lab'} down[/green] in {time.monotonic() - t0:.1f} s")
    return 0

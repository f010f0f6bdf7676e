"""The lab's CT template as data: Proxmox's `debian-12-standard` package selection, its file name, and
the appliance index `pveam` serves. Pure: the selection is a function of a Debian `Packages` file.

Proxmox builds its system templates with dab (proxmox/dab `PVE/DAB.pm`, `new` and `bootstrap`;
proxmox/dab-pve-appliances `debian-12-bookworm-std-64/dab.conf`): every package of Priority
required, important or standard, plus `less ssh openssh-server logrotate postfix` and
systemd-sysv, minus a fixed exclude list, closed over Depends and Pre-Depends (the first alternative
that resolves; Recommends are not followed). So python3 is there (reportbug depends on it) while
python3-venv, python3-dev, python3-apt, patch and any compiler are not (Priority optional).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from toolkit.core.errors import ToolkitError


# dab's appliance names and versions (dab-pve-appliances 0ed1617: debian-12 12.12-1, debian-13 13.1-2).
@dataclass(frozen=True)
class Appliance:
    suite: str
    name: str
    version: str
    description: str

    @property
    def file_name(self) -> str:
        return f"{self.name}_{self.version}_amd64.tar.zst"

    @property
    def ostype(self) -> str:
        return "debian"


APPLIANCES = {
    "bookworm": Appliance("bookworm", "debian-12-standard", "12.12-1", "Debian 12 Bookworm (standard)"),
    "trixie": Appliance("trixie", "debian-13-standard", "13.1-2", "Debian 13 Trixie (standard)"),
}
DEFAULT_SUITE = "bookworm"
# Which templates `lab up` builds and pve1's `pveam available` lists: the one the roles take by default
# (lxc_gpu_container_template_pattern: debian-12-standard) unless this names more, e.g. `bookworm,trixie` or `all`
# for an inventory that picks debian-13-standard. Each is an mmdebstrap of its own on a cold machine.
TEMPLATES_ENV = "TOOLKIT_LAB_TEMPLATES"


def suites_wanted(value: str | None) -> tuple[str, ...]:
    """The suites to build for `TOOLKIT_LAB_TEMPLATES` (unset or empty: the default one only)."""
    if not value or not value.strip():
        return (DEFAULT_SUITE,)
    if value.strip() == "all":
        return tuple(APPLIANCES)
    names = tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    unknown = [n for n in names if n not in APPLIANCES]
    if unknown:
        raise ToolkitError.of(f"{TEMPLATES_ENV}: no CT template for {', '.join(unknown)}", field=TEMPLATES_ENV,
                              fix=f"name Debian suites among {', '.join(APPLIANCES)}, or all")
    return names if DEFAULT_SUITE in names else (DEFAULT_SUITE, *names)
# Names of older index entries a host may still have downloaded; `pveam available` no longer lists them.
RETIRED_FILE_NAMES = ("debian-12-standard_12.7-1_amd64.tar.zst",)

# DAB.pm `new`: $incl and $excl (the non-Ubuntu branch adds the second line).
DAB_INCLUDE = ("less", "ssh", "openssh-server", "logrotate")
DAB_EXCLUDE = ("modutils", "reiserfsprogs", "ppp", "pppconfig", "pppoe", "pppoeconf", "nfs-common", "mtools", "ntp",
               "module-init-tools", "pciutils", "hdparm", "memtest86+", "parted")
# DAB.pm `bootstrap`: the default MTA, and systemd-sysv for /sbin/init.
DAB_MTA = "postfix"
_SKIP = re.compile(r"exim|selinux|semanage|policycoreutils")


def parse_packages(text: str) -> dict[str, dict[str, str]]:
    """A Debian `Packages` file -> {package: {field (lower case): value}}; the last stanza of a name wins."""
    out: dict[str, dict[str, str]] = {}
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line
            elif ":" in line:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if "package" in fields:
            out[fields["package"]] = fields
    return out


def _provides(info: dict[str, str]) -> list[str]:
    return [p.split()[0] for p in info.get("provides", "").split(",") if p.strip()]


def _closure(pkginfo: dict[str, dict[str, str]], closure: set[str], roots: list[str]) -> list[str]:
    """DAB.pm `closure` / `__closure_single`: provides of the roots first, then depth-first over
    Pre-Depends and Depends, an alternative already in the closure satisfying the dependency."""
    for name in roots:
        for p in _provides(pkginfo.get(name, {})):
            if p not in roots:
                closure.add(p)
    picked: list[str] = []

    def single(name: str) -> None:
        name = name.strip().removesuffix(":any")
        if name in closure:
            return
        info = pkginfo.get(name)
        if info is None:
            raise KeyError(f"no such package '{name}'")
        if name not in picked:
            picked.insert(0, name)
        closure.update(_provides(info))
        closure.add(name)
        deps = [d for f in ("pre-depends", "depends") for d in info.get(f, "").split(",") if d.strip()]
        for dep in deps:
            alts = [a.split()[0] for a in dep.split("|") if a.split()]
            if any(a in closure for a in alts):
                continue
            for alt in alts:
                if alt in DAB_EXCLUDE:
                    continue
                try:
                    single(alt)
                    break
                except KeyError:
                    continue
            else:
                raise KeyError(f"package '{name}' could not satisfy dependency '{dep.strip()}'")

    for name in roots:
        single(name)
    return picked


def dab_selection(pkginfo: dict[str, dict[str, str]]) -> list[str]:
    """The packages dab installs for a Debian standard template, sorted (real packages only)."""
    required = ["systemd-sysv"]
    important = [*DAB_INCLUDE, DAB_MTA]
    standard = []
    for name in sorted(pkginfo):
        if name in DAB_EXCLUDE or _SKIP.search(name):
            continue
        priority = pkginfo[name].get("priority", "")
        if priority == "required":
            required.append(name)
        elif priority == "important":
            important.append(name)
        elif priority == "standard":
            standard.append(name)
    closure: set[str] = set()
    picked = _closure(pkginfo, closure, required) + _closure(pkginfo, closure, important)
    picked += _closure(pkginfo, closure, standard)
    return sorted(set(picked))


def installed_packages(dpkg_status: str) -> list[str]:
    """Names of the packages /var/lib/dpkg/status says are installed."""
    return sorted(name for name, f in parse_packages(dpkg_status).items()
                  if f.get("status", "").endswith(" installed"))


def render_aplinfo(appliances: list[Appliance], sha512: dict[str, str], location: str) -> str:
    """The appliance index (`aplinfo.dat`, pve-manager PVE/APLInfo.pm format) the lab's pveam reads."""
    stanzas = []
    for a in appliances:
        stanzas.append("\n".join([
            f"Package: {a.name}",
            f"Version: {a.version}",
            "Type: lxc",
            "OS: debian",
            "Section: system",
            "Maintainer: Proxmox Support Team <support@proxmox.com>",
            "Architecture: amd64",
            f"Location: {location}/{a.file_name}",
            f"sha512sum: {sha512.get(a.file_name, '')}",
            "Infopage: https://pve.proxmox.com/wiki/Linux_Container#pct_supported_distributions",
            f"Description: {a.description}",
            " lab stand-in: built by the toolkit from Debian's archive with dab's package selection.",
        ]))
    return "\n\n".join(stanzas) + "\n"

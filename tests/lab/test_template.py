"""The CT template is Proxmox's debian-12-standard: dab's selection (pure, on a small index), and the
cached template's dpkg status against the selection computed from the archive index it was built from."""

from __future__ import annotations

import lzma

import pytest

from toolkit.lab import rootfs, template

INDEX = """\
Package: base-files
Priority: required
Depends: mawk | awk

Package: mawk
Priority: required
Provides: awk

Package: gawk
Priority: optional
Provides: awk

Package: cron
Priority: important
Depends: cron-daemon-common, default-mta | mail-transport-agent

Package: cron-daemon-common
Priority: important

Package: postfix
Priority: optional
Provides: mail-transport-agent
Depends: ssl-cert

Package: ssl-cert
Priority: optional

Package: exim4-daemon-light
Priority: standard
Provides: mail-transport-agent

Package: reportbug
Priority: standard
Pre-Depends: python3

Package: python3
Priority: optional
Recommends: python3-venv

Package: python3-venv
Priority: optional

Package: patch
Priority: optional

Package: pciutils
Priority: standard

Package: systemd-sysv
Priority: important

Package: less
Priority: important

Package: ssh
Priority: optional
Depends: openssh-server

Package: openssh-server
Priority: optional

Package: logrotate
Priority: important
"""


def test_dab_selection_follows_priorities_depends_and_excludes() -> None:
    got = template.dab_selection(template.parse_packages(INDEX))
    # required + important + standard, dab's includes (postfix the MTA), closed over (Pre-)Depends only.
    assert got == sorted(["base-files", "mawk", "cron", "cron-daemon-common", "postfix", "ssl-cert", "reportbug",
                          "python3", "systemd-sysv", "less", "ssh", "openssh-server", "logrotate"])
    # What the roles must bring themselves: Recommends are not followed, optional packages not taken.
    assert "python3-venv" not in got and "patch" not in got
    # dab's excludes (pciutils), exim (postfix is the MTA), and an alternative already provided (gawk) stay out.
    assert not {"pciutils", "exim4-daemon-light", "gawk"} & set(got)


def test_file_name_is_the_index_current_one() -> None:
    assert template.APPLIANCES["bookworm"].file_name == "debian-12-standard_12.12-1_amd64.tar.zst"
    assert template.APPLIANCES["bookworm"].file_name not in template.RETIRED_FILE_NAMES
    assert template.APPLIANCES["trixie"].file_name == "debian-13-standard_13.1-2_amd64.tar.zst"


@pytest.mark.parametrize("suite", sorted(template.APPLIANCES))
def test_cached_template_has_exactly_dabs_package_set(suite: str) -> None:
    built = rootfs.template_dir(suite)
    if not (built / ".toolkit-lab-complete").is_file():
        pytest.skip("no cached CT template here (`toolkit lab up` builds it)")
    index = template.parse_packages(lzma.decompress((built / "Packages.xz").read_bytes()).decode())
    expected = template.dab_selection(index)
    installed = template.installed_packages((built / "dpkg-status").read_text())
    assert installed == expected
    for absent in ("python3-venv", "python3-dev", "patch", "gcc", "build-essential", "curl"):
        assert absent not in installed
    assert {"python3", "openssh-server", "systemd-sysv", "postfix"} <= set(installed)

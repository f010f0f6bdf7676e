"""The engine lock: every package an SGLang release needs on Linux x86_64 for one container CPython, pinned.

A lock is data in the repository (`profiles/requirements/sglang-<release>-cp<NN>.lock`), so `git diff` shows what a
release move changes in the engine. It is a pip requirements file that `pip install --require-hashes --no-deps -r`
reads as it is: one `name==version` per package with its sha256, sorted by normalized name, after a header of
comments that say where it came from and how to make it again. Nothing in it changes from one run to the next
unless the resolution changed (no dates), so a re-lock that finds the same engine leaves the file byte for byte.

A release whose engine cannot be resolved from the index gets a refusal record instead
(`sglang-<release>-cp<NN>.lock.refused`): the missing requirement, what pins it, the index and the command, so a
profile on that release is refused before a deploy rather than dying on a host.

Pure: text in, data out. The resolver that writes these is toolkit/adapters/pip_resolver.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from toolkit.core.errors import Problem, ToolkitError

LOCK_SCHEMA = 1
REFUSAL_SCHEMA = 1
LOCK_DIR = "profiles/requirements"
PYPI_SIMPLE = "https://pypi.org/simple"

# The CPython of each Debian release Proxmox ships a standard template of (dab-pve-appliances:
# debian-12-standard has 3.11, debian-13-standard 3.13): the interpreters a container's venv can have.
CONTAINER_PYTHONS: tuple[str, ...] = ("3.11", "3.13")

# Every platform tag a wheel for Debian 12 (glibc 2.36) or 13 (glibc 2.41) on x86_64 may carry. pip does not
# expand `manylinux_2_36` to the older glibc tags when --platform is given, and NVIDIA's CUDA wheels are
# `manylinux_2_27` (0.5.9's nvidia-cudnn-cu12==9.10.2.21 has no 2_28 or 2_17 wheel), so each one is named.
# 2.36 as the top keeps one list valid for both Debian releases.
MAX_GLIBC_MINOR = 36
PLATFORM_TAGS: tuple[str, ...] = (
    *(f"manylinux_2_{n}_x86_64" for n in range(MAX_GLIBC_MINOR, 16, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)
PLATFORM_TEXT = f"Linux x86_64, glibc 2.17-2.{MAX_GLIBC_MINOR} (manylinux), wheels only"

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_VERSION = r"[A-Za-z0-9][A-Za-z0-9.+!_-]*"
_ENTRY_RE = re.compile(rf"^({_NAME})==({_VERSION})((?:\s+--hash=sha256:[0-9a-f]{{64}})+)\s*$")
_HASH_RE = re.compile(r"--hash=sha256:([0-9a-f]{64})")
_HEADER_RE = re.compile(r"^#\s*([a-z][a-z0-9-]*):\s*(.*?)\s*$")
_RELEASE_RE = re.compile(r"^\d+\.\d+(?:\.\d+)*(?:(?:a|b|rc|\.post|\.dev)\d+)*$")
_PYTHON_RE = re.compile(r"^3\.(\d{1,2})$")

_FIX_REGENERATE = "make it again with `toolkit profile lock --sglang-version {release} --python {python}`"


def normalize_name(name: str) -> str:
    """A distribution's name as PEP 503 compares it: `Flashinfer_Python` and `flashinfer-python` are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


def python_tag(python: str) -> str:
    """`3.11` -> `cp311`; refuses anything that is not a CPython 3 minor release."""
    m = _PYTHON_RE.match(python)
    if not m:
        raise ToolkitError.of(f"{python!r} is not a CPython version", field="python",
                              fix="give the container's CPython as MAJOR.MINOR, e.g. 3.11 or 3.13")
    return f"cp3{m.group(1)}"


def check_release(sglang_version: str) -> str:
    if not _RELEASE_RE.match(sglang_version):
        raise ToolkitError.of(f"{sglang_version!r} is not an SGLang release", field="sglang_version",
                              fix="give an exact release, e.g. 0.5.9")
    return sglang_version


def lock_path(sglang_version: str, python: str) -> str:
    """Where the lock of this release for this container CPython lives, relative to the repository root."""
    return f"{LOCK_DIR}/sglang-{check_release(sglang_version)}-{python_tag(python)}.lock"


def refusal_path(sglang_version: str, python: str) -> str:
    """Where the refusal record lives when the release cannot be locked for this CPython."""
    return lock_path(sglang_version, python) + ".refused"


def regenerate_command(sglang_version: str, python: str, index_url: str = PYPI_SIMPLE) -> str:
    cmd = f"toolkit profile lock --sglang-version {sglang_version} --python {python}"
    return cmd if index_url == PYPI_SIMPLE else f"{cmd} --index-url {index_url}"


def redact_url(url: str) -> str:
    """An index URL without its credentials: the lock and its refusal are committed, a token must not be."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", r"\1", url)


@dataclass(frozen=True)
class LockEntry:
    """One package of the engine: exactly this version, one of these files."""

    name: str  # normalized (PEP 503)
    version: str
    sha256s: tuple[str, ...]
    wheel: str | None = None  # the file the resolver chose, for a reader of the diff; pip goes by the hash

    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class EngineLock:
    sglang_version: str
    python: str  # "3.11"
    entries: tuple[LockEntry, ...]
    index_url: str = PYPI_SIMPLE
    pip_version: str = ""
    _by_name: dict[str, LockEntry] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.entries, key=lambda e: e.name))
        object.__setattr__(self, "entries", ordered)
        self._by_name.update({e.name: e for e in ordered})

    def get(self, name: str) -> LockEntry | None:
        """The entry of this distribution, whatever spelling of its name is given."""
        return self._by_name.get(normalize_name(name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and normalize_name(name) in self._by_name

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries)

    @property
    def path(self) -> str:
        return lock_path(self.sglang_version, self.python)

    @property
    def pins(self) -> tuple[str, ...]:
        """`name==version` of every package: the constraints a check resolves under."""
        return tuple(e.requirement() for e in self.entries)

    def requirements_text(self) -> str:
        """The part pip reads: what the venv gets, nothing about how it was found."""
        return "".join(_entry_text(e) for e in self.entries)

    @property
    def digest(self) -> str:
        """sha256 of the canonical requirement text: equal for two locks that install the same files, so a venv
        directory named after it is rebuilt exactly when the engine changes (not when pip's version in the
        header does)."""
        text = f"sglang {self.sglang_version} cpython {self.python}\n" + self.requirements_text()
        return hashlib.sha256(text.encode()).hexdigest()


def _entry_text(e: LockEntry) -> str:
    hashes = " \\\n".join(f"    --hash=sha256:{h}" for h in e.sha256s)
    return f"{e.requirement()} \\\n{hashes}\n"


def _provenance(sglang_version: str, python: str, index_url: str | None) -> dict[str, object]:
    out: dict[str, object] = {"sglang": sglang_version, "python": python, "platform": PLATFORM_TEXT}
    return out if index_url is None else {**out, "index": redact_url(index_url)}


def _field_lines(prefix: str, fields: dict[str, object]) -> list[str]:
    """`key: value` lines, in the order given: the header fields parse_lock and parse_refusal read back."""
    return [f"{prefix}{key}: {value}" for key, value in fields.items()]


def format_lock(lock: EngineLock) -> str:
    """The lock file's text: a header of comments, then each package, sorted by name."""
    header = [
        f"# The SGLang {lock.sglang_version} engine for CPython {lock.python} on Linux x86_64: every package, its",
        "# exact version and sha256, resolved by pip's own resolver from the index below. Written by",
        "# `toolkit profile lock`; install it with `pip install --require-hashes --no-deps -r FILE`.",
        *_field_lines("# ", {
            "lock-schema": LOCK_SCHEMA, **_provenance(lock.sglang_version, lock.python, lock.index_url),
            "pip": lock.pip_version or "unknown", "packages": len(lock.entries),
            "regenerate": regenerate_command(lock.sglang_version, lock.python, redact_url(lock.index_url))}),
        "",
    ]
    body = []
    for e in lock.entries:
        if e.wheel:
            body.append(f"# wheel: {e.wheel}\n")
        body.append(_entry_text(e))
    return "\n".join(header) + "\n" + "".join(body)


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """(first line number, line) with `\\` continuations joined, as pip reads a requirements file."""
    start, parts = 0, list[str]()
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if not parts:
            start = no
        if line.endswith("\\") and not line.lstrip().startswith("#"):
            parts.append(line[:-1])
            continue
        parts.append(line)
        yield start, " ".join(p.strip() for p in parts)
        parts = []
    if parts:
        yield start, " ".join(p.strip() for p in parts)


def _header(text: str, source: str, schema_key: str, schema: int, kind: str) -> dict[str, tuple[int, str]]:
    """The `# key: value` (or `key: value`) fields of a lock's or refusal's header, with their line numbers."""
    fields: dict[str, tuple[int, str]] = {}
    for no, line in enumerate(text.splitlines(), start=1):
        m = _HEADER_RE.match(line) or re.match(r"^([a-z][a-z0-9-]*):\s*(.*?)\s*$", line)
        if m and m.group(1) not in fields:
            fields[m.group(1)] = (no, m.group(2))
    if schema_key not in fields:
        raise ToolkitError.of(
            f"not a toolkit {kind}: no `{schema_key}` line", file=source, line=1,
            fix="write it with `toolkit profile lock`; a hand-written requirements file is not a lock")
    no, value = fields[schema_key]
    if not value.isdigit() or int(value) > schema:
        raise ToolkitError.of(
            f"{schema_key} {value!r} is newer than this toolkit reads ({schema})", file=source, line=no,
            field=schema_key, fix="update the toolkit, or write the file again with this one")
    return fields


def _required(fields: dict[str, tuple[int, str]], key: str, source: str, fix: str) -> tuple[int, str]:
    if key not in fields or not fields[key][1]:
        raise ToolkitError.of(f"the header has no `{key}:`", file=source, line=1, field=key, fix=fix)
    return fields[key]


def parse_lock(text: str, source: str) -> EngineLock:
    """A lock file's text as an EngineLock; anything else (a range, a marker, a package without its hash, the
    same package twice, an sglang that is not the header's release) is refused with its line."""
    fields = _header(text, source, "lock-schema", LOCK_SCHEMA, "engine lock")
    _, release = _required(fields, "sglang", source, "write the lock with `toolkit profile lock`")
    _, python = _required(fields, "python", source, "write the lock with `toolkit profile lock`")
    try:
        check_release(release)
        python_tag(python)
    except ToolkitError as err:
        raise ToolkitError.of(str(err.problems[0].message), file=source, line=fields["sglang"][0],
                              fix="write the lock with `toolkit profile lock`") from None
    fix = _FIX_REGENERATE.format(release=release, python=python)
    entries: dict[str, LockEntry] = {}
    wheel: str | None = None
    for no, line in _logical_lines(text):
        if not line.strip():
            continue
        if line.lstrip().startswith("#"):
            m = re.match(r"^#\s*wheel:\s*(\S+)\s*$", line.strip())
            wheel = m.group(1) if m else wheel
            continue
        m = _ENTRY_RE.match(line.strip())
        if not m:
            raise ToolkitError.of(
                f"not a locked requirement: {line.strip()[:120]!r} (a lock line is `name==version` and its "
                "`--hash=sha256:` values, nothing else)", file=source, line=no, fix=fix)
        name = normalize_name(m.group(1))
        if name in entries:
            raise ToolkitError.of(f"{name} is locked twice", file=source, line=no, fix=fix)
        entries[name] = LockEntry(name, m.group(2), tuple(_HASH_RE.findall(m.group(3))), wheel)
        wheel = None
    lock = EngineLock(release, python, tuple(entries.values()),
                      index_url=fields.get("index", (0, PYPI_SIMPLE))[1] or PYPI_SIMPLE,
                      pip_version=fields.get("pip", (0, ""))[1])
    sglang = lock.get("sglang")
    if sglang is None or sglang.version != release:
        raise ToolkitError.of(
            f"the header says SGLang {release} but the lock has "
            + (f"sglang=={sglang.version}" if sglang else "no sglang line"),
            file=source, line=fields["sglang"][0], fix=fix)
    return lock


@dataclass(frozen=True)
class LockRefusal:
    """A release that cannot be locked for a CPython: what pip could not find, and what asked for it."""

    sglang_version: str
    python: str
    missing: str  # the requirement no file on the index satisfies, e.g. nvidia-nccl-cu13==2.30.7
    required_by: str  # what pins it, e.g. torch==2.14.1 (empty when pip did not say)
    index_url: str = PYPI_SIMPLE
    pip_version: str = ""
    detail: str = ""  # pip's own words, one line

    @property
    def path(self) -> str:
        return refusal_path(self.sglang_version, self.python)

    @property
    def command(self) -> str:
        return regenerate_command(self.sglang_version, self.python, redact_url(self.index_url))

    def reason(self) -> str:
        by = f" (required by {self.required_by})" if self.required_by else ""
        return (f"SGLang {self.sglang_version} cannot be locked for CPython {self.python}: "
                f"{redact_url(self.index_url)} has no {self.missing}{by}")


def format_refusal(refusal: LockRefusal) -> str:
    lines = [
        f"# SGLang {refusal.sglang_version} cannot be locked for CPython {refusal.python} on Linux x86_64: pip's",
        "# resolver found no file for the requirement below on the index. A profile on this release is refused",
        "# before it deploys. Written by `toolkit profile lock`; a run that resolves replaces this with the lock.",
        *_field_lines("", {
            "refusal-schema": REFUSAL_SCHEMA, **_provenance(refusal.sglang_version, refusal.python, None),
            "missing": refusal.missing, "required-by": refusal.required_by,
            "index": redact_url(refusal.index_url), "pip": refusal.pip_version or "unknown",
            "command": refusal.command, "pip-says": " ".join(refusal.detail.split())}),
    ]
    return "\n".join(lines) + "\n"


def parse_refusal(text: str, source: str) -> LockRefusal:
    fields = _header(text, source, "refusal-schema", REFUSAL_SCHEMA, "lock refusal")
    fix = "write it with `toolkit profile lock`"
    _, release = _required(fields, "sglang", source, fix)
    _, python = _required(fields, "python", source, fix)
    _, missing = _required(fields, "missing", source, fix)
    return LockRefusal(release, python, missing, fields.get("required-by", (0, ""))[1],
                       index_url=fields.get("index", (0, PYPI_SIMPLE))[1] or PYPI_SIMPLE,
                       pip_version=fields.get("pip", (0, ""))[1], detail=fields.get("pip-says", (0, ""))[1])


@dataclass(frozen=True)
class LockDifference:
    """How a resolution (under the lock's pins, or fresh) differs from the committed lock. Empty: the lock is
    closed (pip adds nothing, drops nothing, moves nothing)."""

    added: tuple[LockEntry, ...] = ()  # pip wants these and the lock lacks them
    dropped: tuple[LockEntry, ...] = ()  # the lock has these and pip no longer wants them
    changed: tuple[tuple[LockEntry, LockEntry], ...] = ()  # (committed, resolved): another version or file

    def __bool__(self) -> bool:
        return bool(self.added or self.dropped or self.changed)

    def lines(self) -> list[str]:
        out = [f"+ {e.requirement()} (pip adds it)" for e in self.added]
        out += [f"- {e.requirement()} (pip no longer wants it)" for e in self.dropped]
        for old, new in self.changed:
            what = "version" if old.version != new.version else "file (sha256)"
            out.append(f"~ {old.requirement()} -> {new.requirement()} ({what})")
        return out


def compare(committed: EngineLock, resolved: EngineLock) -> LockDifference:
    """What re-resolving the release changed against the committed lock. A hash counts as the same file when the
    resolver's is among the lock's (a lock may list several files of one version)."""
    added = tuple(e for e in resolved.entries if e.name not in committed)
    dropped = tuple(e for e in committed.entries if e.name not in resolved)
    changed = []
    for new in resolved.entries:
        old = committed.get(new.name)
        if old and (old.version != new.version or not set(new.sha256s) <= set(old.sha256s)):
            changed.append((old, new))
    return LockDifference(added, dropped, tuple(changed))


def subset(lock: EngineLock, keep: Sequence[str]) -> tuple[LockEntry, ...]:
    """The entries of these names (any spelling), in the lock's order; a name the lock lacks is refused."""
    missing = [n for n in keep if n not in lock]
    if missing:
        raise ToolkitError.of(f"{lock.path} has no {', '.join(missing)}", file=lock.path,
                              fix="name packages the lock has (`grep == FILE`)")
    wanted = {normalize_name(n) for n in keep}
    return tuple(e for e in lock.entries if e.name in wanted)


_LOCK_NAME_RE = re.compile(r"^(.+)-cp3\d{1,2}\.lock$")


def profile_lock_paths(sglang_version: str, requirements: str | None,
                       pythons: Sequence[str] = CONTAINER_PYTHONS) -> dict[str, str] | None:
    """python -> the repo-relative lock a profile's venv is installed from: derived from the pinned release, or
    from `engine.requirements` when it names one of a set of locks (`.../NAME-cp311.lock`: its siblings for the
    other Pythons are `.../NAME-cp313.lock`). None when `requirements` names no lock."""
    if requirements is None:
        return {py: lock_path(sglang_version, py) for py in pythons}
    m = _LOCK_NAME_RE.match(requirements)
    if not m:
        return None
    return {py: f"{m.group(1)}-{python_tag(py)}.lock" for py in pythons}


def lock_problems(sglang_version: str, requirements: str | None, files: Mapping[str, str | None], *,
                  profile_file: str, pythons: Sequence[str] = CONTAINER_PYTHONS) -> list[Problem]:
    """A profile's engine lock, one per container CPython: present, well-formed and of the pinned release, else
    the error that names the lock file and the refusal's reason or the command that makes it.

    `files`: repo-relative path -> its text (None: absent), for every path of profile_lock_paths and each one's
    `.refused` beside it; the caller reads them, this judges."""
    field_name = "engine.requirements" if requirements is not None else "engine.sglang_version"
    paths = profile_lock_paths(sglang_version, requirements, pythons)
    if paths is None:
        return [Problem(
            f"{requirements} is not an engine lock: the venv is installed from a lock per container CPython "
            f"(pip's resolution, exact versions and sha256), {lock_path(sglang_version, pythons[0])} and its "
            "siblings", file=profile_file, field=field_name, rule_id="engine-lock",
            fix="delete engine.requirements (the lock follows engine.sglang_version) and run "
            f"`toolkit profile lock --sglang-version {sglang_version}`")]
    out = []
    refusals: dict[str, LockRefusal] = {}
    for python, path in paths.items():
        text, refused = files.get(path), files.get(path + ".refused")
        if text is not None:
            try:
                lock = parse_lock(text, path)
            except ToolkitError as err:
                out += [dataclasses.replace(p, rule_id="engine-lock") for p in err.problems]
                continue
            if lock.sglang_version != sglang_version or lock.python != python:
                out.append(Problem(
                    f"{path} locks SGLang {lock.sglang_version} for CPython {lock.python}, not the profile's "
                    f"SGLang {sglang_version} for CPython {python}", file=profile_file, field=field_name,
                    rule_id="engine-lock",
                    fix=f"point engine.requirements at locks of {sglang_version}, or delete it to use "
                    f"{lock_path(sglang_version, python)}"))
        elif refused is not None:
            try:
                refusals[python] = parse_refusal(refused, path + ".refused")
            except ToolkitError as err:
                out += [dataclasses.replace(p, rule_id="engine-lock") for p in err.problems]
        else:
            out.append(Problem(
                f"no engine lock for SGLang {sglang_version} on CPython {python}: {path} does not exist",
                file=profile_file, field=field_name, rule_id="engine-lock",
                fix=f"run `{regenerate_command(sglang_version, python)}` and commit the file"
                if requirements is None else f"write {path} (`toolkit profile lock` writes the release's own "
                "locks), or delete engine.requirements"))
    # A release refused on every container Python cannot be deployed anywhere: an error. Refused on some only
    # (0.5.9 on 3.13: a dependency without a cp313 wheel), it deploys to containers of the others, and the deploy
    # refuses a container of a refused Python; here it is information, located in the refusal record (one line
    # for every profile on the release, not one each).
    every = len(refusals) == len(paths)
    for python, refusal in refusals.items():
        where = "" if every else (f": containers with CPython {python} are refused, those with "
                                  f"{', '.join(p for p in paths if p not in refusals)} deploy")
        out.append(Problem(
            f"{refusal.reason()}{where}", file=profile_file if every else refusal_path(sglang_version, python),
            field=field_name if every else None, rule_id="engine-lock", severity="error" if every else "info",
            fix="pin a release that locks, or lock this one from an index that has "
            f"{refusal.missing}: `{refusal.command} --index-url URL`"))
    return out

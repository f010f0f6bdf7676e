"""SGLang's router, pinned per release: which package and version serves replicas of a release, and its command line.

The pins are data (toolkit/data/sglang_router/pins.json, keyed by SGLang release like the flag catalogues), read
by an adapter and handed in here as `RouterPins`: this module does no I/O. The router is the SGLang Model Gateway
as published on PyPI (`smg`); its command line is `smg launch` with the flags its own parser registers
(`--worker-urls`, `--policy`, `--host`, `--port`, `--prometheus-port`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.profile.catalogue import release_key

PINS_SCHEMA_VERSION = 1
PINS_FILE = "toolkit/data/sglang_router/pins.json"
# What the pin says of itself: smg's own CI or image built on this release, or the pin of the nearest earlier one.
BASES = ("tested", "carried")
# The router's Prometheus exporter listens on 29000 unless told otherwise (router_args.py's default), so two
# routers on one host clash unless each is given its own port.
DEFAULT_PROMETHEUS_PORT = 29000


@dataclass(frozen=True)
class RouterPin:
    """The router one SGLang release is served behind."""

    release: str
    package: str  # the PyPI distribution
    version: str
    command: tuple[str, ...]  # the console script and subcommand that launch it
    policies: tuple[str, ...]  # --policy's choices in that version's parser
    basis: str  # one of BASES
    evidence: str

    @property
    def requirement(self) -> str:
        """What pip installs: `smg==1.9.0`."""
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class RouterPins:
    """Every release's pin, as read from the pins file."""

    pins: Mapping[str, RouterPin]

    def releases(self) -> list[str]:
        return sorted(self.pins, key=release_key)


def _bad(message: str, field: str) -> ToolkitError:
    return ToolkitError.of(message, file=PINS_FILE, field=field,
                           fix="restore the file from the toolkit's repository (git checkout -- " + PINS_FILE + ")")


def _strings(value: Any, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _bad(f"{value!r} is not a list of names", field)
    return tuple(value)


def pins_from_json(data: Any) -> RouterPins:
    """The pins file's contents, checked: each release names a router entry that exists and says how it was pinned."""
    if not isinstance(data, dict):
        raise _bad("the pins file is not a mapping", "(top)")
    version = data.get("schema_version")
    if version != PINS_SCHEMA_VERSION:
        raise _bad(f"schema_version {version!r}, this toolkit reads {PINS_SCHEMA_VERSION}", "schema_version")
    routers, releases = data.get("routers"), data.get("releases")
    if not isinstance(routers, dict) or not isinstance(releases, dict) or not releases:
        raise _bad("`routers` and `releases` must be mappings, `releases` not empty", "releases")
    pins: dict[str, RouterPin] = {}
    for release, entry in releases.items():
        where = f"releases.{release}"
        if not isinstance(entry, dict):
            raise _bad("not a mapping", where)
        router = routers.get(entry.get("router"))
        if not isinstance(router, dict):
            raise _bad(f"router {entry.get('router')!r} is not in `routers`", f"{where}.router")
        if entry.get("basis") not in BASES:
            raise _bad(f"basis {entry.get('basis')!r} is not one of {', '.join(BASES)}", f"{where}.basis")
        rwhere = f"routers.{entry['router']}"
        for key in ("package", "version"):
            if not isinstance(router.get(key), str) or not router[key]:
                raise _bad(f"`{key}` is missing", f"{rwhere}.{key}")
        pins[release] = RouterPin(
            release=release, package=router["package"], version=router["version"],
            command=_strings(router.get("command"), f"{rwhere}.command"),
            policies=_strings(router.get("policies"), f"{rwhere}.policies"),
            basis=entry["basis"], evidence=str(entry.get("evidence") or ""))
    return RouterPins(pins)


def router_pin(pins: RouterPins, release: str) -> RouterPin:
    """The pin of `release`, or an error naming the releases that have one."""
    pin = pins.pins.get(release)
    if pin is None:
        known = pins.releases()
        raise ToolkitError.of(
            f"no router is pinned for SGLang {release}",
            file=PINS_FILE, field=f"releases.{release}",
            fix=f"pin the profile to a release that has one ({known[0]} ... {known[-1]}), or add {release} to "
                f"{PINS_FILE} with the smg version that release is served behind",
        )
    return pin


def router_argv(release: str, worker_urls: Sequence[str], policy: str, host: str, port: int, *,
                pins: RouterPins, prometheus_port: int | None = None) -> list[str]:
    """The router's command line for `release`: `smg launch --worker-urls URL... --policy P --host H --port N`, and
    `--prometheus-port` when given (the exporter's default port is shared by every router on a host). Refuses what
    the pinned router's parser would refuse (a policy outside its choices), and what would start a router with
    nothing behind it or clashing with itself."""
    pin = router_pin(pins, release)
    if not worker_urls:
        raise ToolkitError.of("the router needs at least one backend", field="worker_urls",
                              fix="list the replicas' URLs (http://HOST:PORT)")
    for url in worker_urls:
        if not (url.startswith("http://") or url.startswith("https://")) or " " in url:
            raise ToolkitError.of(f"{url!r} is not an http(s) URL", field="worker_urls",
                                  fix="give each backend as http://HOST:PORT")
    if len(set(worker_urls)) != len(worker_urls):
        raise ToolkitError.of("a backend is listed twice", field="worker_urls", fix="list each replica once")
    if policy not in pin.policies:
        raise ToolkitError.of(
            f"policy {policy!r} is not one smg {pin.version} (pinned for SGLang {release}) knows",
            field="policy", fix=f"use one of: {', '.join(pin.policies)}")
    for name, value in (("port", port), ("prometheus_port", prometheus_port)):
        if value is not None and not 1 <= value <= 65535:
            raise ToolkitError.of(f"{name} {value} is not a TCP port", field=name, fix="give a port in 1..65535")
    if prometheus_port is not None and prometheus_port == port:
        raise ToolkitError.of(f"the router's port and its Prometheus port are both {port}", field="prometheus_port",
                              fix="give the metrics exporter a port of its own")
    argv = [*pin.command, "--worker-urls", *worker_urls, "--policy", policy, "--host", host, "--port", str(port)]
    if prometheus_port is not None:
        argv += ["--prometheus-port", str(prometheus_port)]
    return argv


@dataclass(frozen=True)
class BackendLoad:
    """One backend as the router sees it (its GET /get_loads): what the router has in flight there, and the
    backend's own scheduler load summed over its data-parallel ranks (the backend's /v1/loads, fetched by the
    router's load monitor; None where the router could not read it)."""

    url: str
    routed_in_flight: int  # the router's count of its requests on this backend now
    running_reqs: int | None
    waiting_reqs: int | None
    token_usage: float | None  # KV-cache use, 0..1, the mean over the ranks
    max_running_requests: int | None


def backend_loads(doc: Any) -> list[BackendLoad]:
    """The router's GET /get_loads body, `{"workers": [{"worker": URL, "load": N, "details": {"loads": [...]}}]}`
    (smg's WorkerLoadInfo, the same from 1.4 to 1.9), per backend, sorted by URL; a body of another shape is an
    error naming what is missing."""
    workers = doc.get("workers") if isinstance(doc, dict) else None
    if not isinstance(workers, list):
        raise ToolkitError.of("the router's /get_loads answer has no `workers` list", field="workers",
                              fix="check that the URL is the router's (smg) and not a backend's")
    out = []
    for entry in workers:
        if not isinstance(entry, dict) or not isinstance(entry.get("worker"), str):
            raise ToolkitError.of(f"a /get_loads entry without a worker URL: {entry!r}", field="workers")
        details = entry.get("details")
        if not isinstance(details, dict):
            details = {}
        ranks = [r for r in details.get("loads") or [] if isinstance(r, dict)]

        def total(key: str, ranks: list[dict[str, Any]] = ranks) -> int | None:
            values = [r[key] for r in ranks if isinstance(r.get(key), int)]
            return sum(values) if values else None

        usage = [float(r["token_usage"]) for r in ranks if isinstance(r.get("token_usage"), int | float)]
        out.append(BackendLoad(
            url=entry["worker"], routed_in_flight=int(entry.get("load") or 0),
            running_reqs=total("num_running_reqs"), waiting_reqs=total("num_waiting_reqs"),
            token_usage=sum(usage) / len(usage) if usage else None,
            max_running_requests=total("max_running_requests")))
    return sorted(out, key=lambda b: b.url)


@dataclass(frozen=True)
class RouterBackendView:
    """One backend on the router's Prometheus exporter (series labelled `worker`, the backend's URL)."""

    url: str
    requests_active: float | None  # smg_worker_requests_active: requests in flight there now
    finished: float  # smg_worker_cb_outcomes_total summed over its outcomes: requests it answered, any way
    failed: float  # the same, outcome "failure"
    healthy: bool | None  # smg_worker_health == 1


def router_backends(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> dict[str, RouterBackendView]:
    """The per-backend series of the router's exposition (samples as the probe's parser yields them: name, labels,
    value), by backend URL: enough to see replicas out of balance (their shares of `finished`) on one clock."""
    active: dict[str, float] = {}
    finished: dict[str, float] = {}
    failed: dict[str, float] = {}
    health: dict[str, bool] = {}
    for name, labels, value in samples:
        url = labels.get("worker")
        if not url:
            continue
        if name == "smg_worker_requests_active":
            active[url] = value
        elif name == "smg_worker_cb_outcomes_total":
            finished[url] = finished.get(url, 0.0) + value
            if labels.get("outcome") == "failure":
                failed[url] = failed.get(url, 0.0) + value
        elif name == "smg_worker_health":
            health[url] = value == 1
    urls = sorted(set(active) | set(finished) | set(health))
    return {u: RouterBackendView(u, active.get(u), finished.get(u, 0.0), failed.get(u, 0.0), health.get(u))
            for u in urls}

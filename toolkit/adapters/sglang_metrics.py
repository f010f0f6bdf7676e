"""SGLang's /metrics and /v1/loads, scraped while the benchmark runs: the only importer of `prometheus_client`.

The exposition is parsed with prometheus_client's own parser (`text_string_to_metric_families`), never a regex:
label escaping, histogram `le` strings and the `_total` renaming of counters are its business (research:
its module docstring). Its samples become plain (name, labels, value) tuples here, so
nothing above this module sees a prometheus_client type.

Faults are data, not exceptions: a server that does not answer, answers an error, or serves text that does not
parse gives a gap row (ok=0, `error` says which) and the next scrape tries again; a counter lower than before
marks `counter_reset`. A server started without --enable-metrics answers 404 on /metrics: from then on only
/v1/loads (always mounted, computed live on each call) is read, and run.json's `server.what_was_not_seen`
lists the columns nothing gave. /metrics needs no API key in SGLang 0.5.9 (srt/utils/auth.py lets /health and
/metrics through); /v1/loads does, read from $SGLANG_API_KEY when set.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from toolkit.core.errors import ToolkitError
from toolkit.core.probe.router_trace import router_header, router_rows
from toolkit.core.probe.server_trace import (
    VALUE_COLUMNS,
    Row,
    Sample,
    format_server_row,
    scrape_row,
    server_header,
    went_backwards,
)

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # the GPU box's bare python: the CLI skips the server timeline and says so
    text_string_to_metric_families = None  # type: ignore[assignment]

LOADS_EVERY_S = 5.0  # the running cap is a setting: once per 5 s is plenty where /metrics gives the gauges
MAX_BODY_BYTES = 16 * 1024 * 1024


def available() -> bool:
    return text_string_to_metric_families is not None


def parse_exposition(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition. Raises ValueError when it does not parse."""
    assert text_string_to_metric_families is not None
    out: list[Sample] = []
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.append((s.name, dict(s.labels), float(s.value)))
    except ValueError:
        raise
    except Exception as err:  # the lax parser raises other types on some garbage (IndexError, KeyError)
        raise ValueError(f"{type(err).__name__}: {err}") from None
    return out


class _HttpError(Exception):
    def __init__(self, status: int | None, text: str) -> None:
        super().__init__(text)
        self.status = status


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(str(text).split()).replace(",", ";")[:limit]


class ServerScraper:
    """tick(t_s) -> one CSV line. base_url like http://127.0.0.1:8000."""

    def __init__(self, base_url: str, scrape_hz: float, *, timeout_s: float | None = None,
                 api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.scrape_hz = scrape_hz
        self.timeout_s = timeout_s if timeout_s is not None else max(0.2, min(2.0, 2.0 / scrape_hz))
        self.api_key = api_key if api_key is not None else os.environ.get("SGLANG_API_KEY") or None
        self.metrics_enabled: bool | None = None  # None until /metrics has answered once
        self.loads_state: str | None = None  # None (unknown), "ok", or why not
        self._last_loads_t = -1e9
        self._last_loads: dict[str, Any] | None = None
        self._prev_good: Row | None = None
        self._ever_seen: set[str] = set()
        self.rows = self.gaps = self.resets = 0
        self.errors: dict[str, int] = {}

    def header(self) -> str:
        return server_header({"scrape_hz": str(self.scrape_hz), "source": self.base_url})

    def _get(self, path: str, *, auth: bool) -> str:
        req = urllib.request.Request(self.base_url + path)
        if auth and self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.read(MAX_BODY_BYTES).decode("utf-8", errors="replace")
        except urllib.error.HTTPError as err:
            raise _HttpError(err.code, f"{path} answered HTTP {err.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            raise _HttpError(None, f"{path}: {_one_line(str(reason)) or type(err).__name__}") from None

    def _loads(self, t_s: float, every_tick: bool) -> dict[str, Any] | None:
        if self.loads_state not in (None, "ok") and not every_tick:
            return self._last_loads
        if not every_tick and t_s - self._last_loads_t < LOADS_EVERY_S:
            return self._last_loads
        self._last_loads_t = t_s
        try:
            data = json.loads(self._get("/v1/loads", auth=True))
            self._last_loads = data if isinstance(data, dict) else None
            self.loads_state = "ok" if self._last_loads is not None else "/v1/loads: not a JSON object"
        except _HttpError as err:
            self.loads_state = str(err) + (" (the server has an API key: export SGLANG_API_KEY for the probe)"
                                           if err.status in (401, 403) else "")
            self._last_loads = None
        except json.JSONDecodeError as err:
            self.loads_state = f"/v1/loads: not JSON ({err.msg})"
            self._last_loads = None
        return self._last_loads

    def scrape(self, t_s: float) -> Row:
        """One scrape as a row (never raises for anything the server does)."""
        samples: list[Sample] | None = None
        error = ""
        if self.metrics_enabled is not False:
            try:
                samples = parse_exposition(self._get("/metrics", auth=False))
                self.metrics_enabled = True
            except _HttpError as err:
                if err.status == 404:
                    self.metrics_enabled = False  # started without --enable-metrics: stop asking
                else:
                    error = str(err)
            except ValueError as err:
                error = f"/metrics: malformed exposition ({_one_line(str(err), 160)})"
        if error:
            return self._gap(t_s, error)
        loads = self._loads(t_s, every_tick=samples is None)
        if samples is None and loads is None:
            return self._gap(t_s, f"/metrics not served (no --enable-metrics) and {self.loads_state}")
        row, _missing = scrape_row(samples, loads)
        if "max_running_requests" not in row and self._prev_good is not None:
            # A setting read every LOADS_EVERY_S: carried into every row, as the GPU trace carries its power limit.
            cap = self._prev_good.get("max_running_requests")
            if cap is not None:
                row["max_running_requests"] = cap
        reset = went_backwards(self._prev_good, row)
        self._prev_good = row
        self._ever_seen.update(k for k, v in row.items() if v is not None)
        self.rows += 1
        self.resets += int(reset)
        return {"t_s": round(t_s, 4), "ok": True, "error": "", "counter_reset": reset, **row}

    def _gap(self, t_s: float, error: str) -> Row:
        self.rows += 1
        self.gaps += 1
        key = error.split(" (")[0][:80]
        self.errors[key] = self.errors.get(key, 0) + 1
        return {"t_s": round(t_s, 4), "ok": False, "error": error}

    def tick(self, t_s: float) -> list[str]:
        return [format_server_row(self.scrape(t_s))]

    def what_was_not_seen(self) -> list[str]:
        notes = []
        if self.metrics_enabled is False:
            notes.append("/metrics: not served (the server runs without --enable-metrics): no counters, no "
                         "histograms, no steady-state throughput from the server")
        elif self.metrics_enabled is None:
            notes.append("/metrics: never answered")
        if self.loads_state not in (None, "ok"):
            notes.append(f"/v1/loads: {self.loads_state}: no running cap (max_running_requests)")
        missing = [c for c in VALUE_COLUMNS if c not in self._ever_seen]
        if missing and self.rows > self.gaps:
            notes.append("never in any scrape: " + ", ".join(missing))
        return notes

    def info(self) -> dict[str, Any]:
        """run.json `server`."""
        return {"url": self.base_url, "scrape_hz": self.scrape_hz, "metrics_enabled": self.metrics_enabled,
                "rows": self.rows, "gaps": self.gaps, "resets": self.resets,
                "gap_errors": dict(sorted(self.errors.items())), "what_was_not_seen": self.what_was_not_seen()}


def server_info(base_url: str, *, api_key: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """The server's /server_info (SGLang's resolved server arguments and `version`), or /get_server_info where a
    release has only the older path."""
    key = api_key if api_key is not None else os.environ.get("SGLANG_API_KEY") or None
    last = ""
    for path in ("/server_info", "/get_server_info"):
        req = urllib.request.Request(base_url.rstrip("/") + path)
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                body = json.loads(resp.read(MAX_BODY_BYTES).decode("utf-8", errors="replace"))
        except urllib.error.HTTPError as err:
            last = f"{path} answered HTTP {err.code}"
            if err.code in (401, 403):
                raise ToolkitError.of(f"{base_url}{path} answered HTTP {err.code}: the server wants an API key",
                                      field="--server-url", fix="export SGLANG_API_KEY=... and run it again"
                                      ) from None
            continue
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            raise ToolkitError.of(f"{base_url}{path}: {_one_line(str(reason)) or type(err).__name__}",
                                  field="--server-url", fix="give the URL the SGLang server listens on, e.g. "
                                  "http://127.0.0.1:30000") from None
        if isinstance(body, dict):
            return body
        last = f"{path} answered {type(body).__name__}, not a JSON object"
    raise ToolkitError.of(f"{base_url} is no SGLang server: {last}", field="--server-url",
                          fix="give the URL the SGLang server listens on, e.g. http://127.0.0.1:30000")


class RouterScraper:
    """The router's per-backend load (its exposition's `smg_worker_requests_active{worker}`), one scrape a tick, for
    a fleet's router_trace.csv. A scrape that fails is a gap row with its error; the run goes on."""

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.rows = 0
        self.gaps = 0

    def header(self, scrape_hz: float) -> str:
        return router_header({"scrape_hz": str(scrape_hz), "source": self.url})

    def tick(self, t_s: float) -> list[str]:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:
                text = resp.read().decode("utf-8", "replace")
            lines = router_rows(t_s, parse_exposition(text))
        except (urllib.error.URLError, OSError, ValueError) as err:
            self.gaps += 1
            lines = router_rows(t_s, None, _one_line(str(err)))
        self.rows += len(lines)
        return lines

"""`toolkit report`: the HTML of a recorded run renders in headless Chromium with its plots, and the pieces.

The Chromium test uses Debian's `chromium` (scripts/debian-packages.txt) with a fresh profile directory and
every background network feature off; the page has no external resources, so nothing leaves the machine.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.results.conftest import Scratch
from toolkit.cli.main import main
from toolkit.core.results.report import throughput_series

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]
LIMIT_RGB = (0xC0, 0x00, 0x00)  # the enforced-limit line in the power plot (toolkit/adapters/plots.py)
LINE_RGB = (0x1F, 0x77, 0xB4)  # matplotlib's first colour: the GPUs' power line and the throughput line
# The report page's boxes (toolkit/adapters/templates/report.html.j2): what ran, then the verdict.
WHAT_RAN_RGB = (0xF3, 0xF3, 0xF3)
VERDICT_RGB = (0xE3, 0xED, 0xFB)
FIRST_SCREEN = (1280, 960)


def _report(s: Scratch, *args: str) -> int:
    assert main(["results", "record", str(s.run), "--profile", "glm5-tp8", "--profiles-dir", str(s.profiles)]) == 0
    return main(["report", "glm5-tp8", "--profiles-dir", str(s.profiles), *args])


def _count_near(img: Image.Image, rgb: tuple[int, int, int], tol: int = 40) -> int:
    px = np.asarray(img.convert("RGB"), dtype=np.int16)
    return int(np.all(np.abs(px - np.array(rgb, dtype=np.int16)) <= tol, axis=-1).sum())


def _rows_of(img: Image.Image, rgb: tuple[int, int, int], tol: int = 2, min_px: int = 200) -> list[int]:
    """The pixel rows where a colour fills at least `min_px` pixels (a box's background, a plot's line)."""
    px = np.asarray(img.convert("RGB"), dtype=np.int16)
    hits = np.all(np.abs(px - np.array(rgb, dtype=np.int16)) <= tol, axis=-1).sum(axis=1)
    return [int(y) for y in np.nonzero(hits >= min_px)[0]]


def screenshot(html_file: Path, shot: Path, work: Path, size: tuple[int, int] = FIRST_SCREEN) -> Image.Image:
    """The page in headless Chromium at `size` (the first screen a reader sees), as an image."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is not installed: run scripts/setup (scripts/debian-packages.txt lists it)")
    proc = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={work / 'chromium-profile'}",
         f"--window-size={size[0]},{size[1]}", f"--screenshot={shot}", html_file.as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    img = Image.open(shot)
    assert img.size == size
    colours = img.convert("RGB").getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 200, "a blank (or text-only) page has few colours"
    assert max(colours)[0] / (img.width * img.height) < 0.9, "one colour fills the screenshot: blank"
    return img


def assert_first_screen(img: Image.Image) -> None:
    """The first screen shows, top to bottom, what ran, the verdict, and the power plot (its limit line)."""
    ran, verdict = _rows_of(img, WHAT_RAN_RGB), _rows_of(img, VERDICT_RGB)
    limit = _rows_of(img, LIMIT_RGB, tol=40, min_px=150)
    assert ran, "no 'what ran' box on the first screen"
    assert verdict, "no verdict box on the first screen"
    assert limit, "no power plot (its enforced-limit line) on the first screen"
    assert ran[0] < verdict[0] < limit[0], (ran[0], verdict[0], limit[0])


@pytest.mark.slow
def test_html_report_renders_in_headless_chromium_with_its_plots(scratch: Scratch, tmp_path: Path) -> None:
    html_file = tmp_path / "report.html"
    assert _report(scratch, "--html", str(html_file)) == 0
    text = html_file.read_text()
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', text)) == 3  # power, util/GPM, throughput
    assert not re.search(r"(src|href)=['\"]https?:", text), "the report must be standalone"
    assert str(tmp_path) not in text and "/work/" not in text, "no absolute path of the machine that made it"
    # The page's order: what ran, the verdict and its next steps, the plots, then the evidence, collapsed.
    order = [text.index(f'id="{key}"') for key in ("what-ran", "verdict", "plots", "figures", "evidence")]
    assert order == sorted(order)
    assert "<details><summary>Evidence behind the verdict" in text
    assert "Every image below is marked LAB STAND-IN" in text
    img = screenshot(html_file, tmp_path / "shot.png", tmp_path)
    assert_first_screen(img)
    tall = screenshot(html_file, tmp_path / "tall.png", tmp_path, (1280, 2600))
    assert _count_near(tall, LIMIT_RGB) > 300, "no enforced-limit line: the power plot did not render"
    assert _count_near(tall, LINE_RGB) > 300, "no data lines: the plots did not render"


def test_markdown_report_has_figures_evidence_knobs_and_plot_files(scratch: Scratch, tmp_path: Path) -> None:
    md = tmp_path / "report.md"
    assert _report(scratch, "--markdown", str(md)) == 0
    text = md.read_text()
    assert "> **LAB STAND-IN: lab stand-in, not a measurement on this profile's hardware.**" in text
    assert text.index("## What ran") < text.index("## Verdict") < text.index("## Plots") < text.index("## Figures")
    assert "| workload | 1,024 prompts, random 256 in / 128 out (range 1), rate inf, no concurrency cap |" in text
    assert "| output tokens per joule | 1.795 |" in text
    assert "| gpm.sm_util_pct | 12.2 |" in text  # the verdict's evidence as a table, collapsed
    assert text.index("<details><summary>Evidence") < text.index("| gpm.sm_util_pct |") < text.index("</details>")
    assert "~ server.max_running_requests: 64 -> 1024" in text  # knobs that differ from the parent
    assert "Every image is marked **LAB STAND-IN**" in text
    for key in ("power", "util-gpm", "throughput"):
        png = tmp_path / f"report-{key}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](report-{key}.png)" in text
    # Every table row has as many cells as its header: no cell broke a table.
    for table in re.findall(r"(?:^\|.*\|$\n?)+", text, re.M):
        widths = {len(re.split(r"(?<!\\)\|", row)) for row in table.strip().splitlines()}
        assert len(widths) == 1, table


def test_report_to_standard_output(scratch: Scratch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`-` is standard output: HTML with its plots embedded, Markdown without files; nothing named `-` appears."""
    monkeypatch.chdir(tmp_path)
    assert main(["results", "record", str(scratch.run), "--profile", "glm5-tp8", "--profiles-dir",
                 str(scratch.profiles)]) == 0
    capsys.readouterr()
    assert main(["report", "glm5-tp8", "--profiles-dir", str(scratch.profiles), "--html", "-"]) == 0
    html = capsys.readouterr().out
    assert html.startswith("<!DOCTYPE html>") and html.count('src="data:image/png;base64,') == 3
    assert main(["report", "glm5-tp8", "--profiles-dir", str(scratch.profiles), "--markdown", "-"]) == 0
    assert capsys.readouterr().out.startswith("# Report: glm5-tp8")
    assert not (tmp_path / "-").exists()
    assert main(["report", "glm5-tp8", "--profiles-dir", str(scratch.profiles), "--markdown", "-", "--html",
                 "-"]) == 2


def test_markdown_fragments_render_as_markdown_and_html_in_them_is_text() -> None:
    from toolkit.adapters.documents import markdown_block, markdown_inline

    assert markdown_inline("`server.tp_size: 8 -> 4`") == "<code>server.tp_size: 8 -&gt; 4</code>"
    assert '<a href="https://github.com/sgl-project/sglang/issues/12964">' in markdown_inline(
        "the bug (https://github.com/sgl-project/sglang/issues/12964).")
    assert "<script>" not in markdown_block("<script>alert(1)</script>")


def test_markdown_on_stdout_without_files(scratch: Scratch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["results", "record", str(scratch.run), "--profile", "glm5-tp8", "--profiles-dir",
                 str(scratch.profiles)]) == 0
    capsys.readouterr()
    assert main(["report", "glm5-tp8", "--profiles-dir", str(scratch.profiles)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Report: glm5-tp8")
    assert "## History" in out and "manual-1" in out


def test_report_of_a_missing_profile_exits_2(scratch: Scratch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "glm5-nope", "--profiles-dir", str(scratch.profiles)]) == 2
    assert "glm5-nope" in capsys.readouterr().err


def test_throughput_series_from_a_token_timeline() -> None:
    # 100 tok/s for 4 s, then nothing for 2 s; bins of 1 s on the probe's clock (bench started at t=10 s).
    timeline = [[0, 0], [2, 200], [4, 400], [6, 400]]
    ts, rates = throughput_series(timeline, 10.0)
    assert ts == [10.5, 11.5, 12.5, 13.5, 14.5, 15.5]
    assert rates == [100.0, 100.0, 100.0, 100.0, 0.0, 0.0]
    assert throughput_series(None, 0.0) == ([], [])


WATERMARK_RGB = (0xF7, 0xDE, 0xDE)  # plots.watermark's red at alpha 0.13 over white


def test_every_image_of_data_not_measured_carries_its_watermark(scratch: Scratch, tmp_path: Path) -> None:
    """The report's plots of a stand-in run, and a sweep's and a tune's plots of lab data, carry SIMULATED; the
    same plots without a mark have none of its tint."""
    from toolkit.adapters import plots

    md = tmp_path / "report.md"
    assert _report(scratch, "--markdown", str(md)) == 0
    for key in ("power", "util-gpm", "throughput"):
        assert _count_near(Image.open(tmp_path / f"report-{key}.png"), WATERMARK_RGB, tol=6) > 800, key
    curves = [{"variant": "v01", "label": "base", "points": [(64, 900.0), (256, 1500.0)]}]
    marked = Image.open(io.BytesIO(plots.sweep_throughput_png(curves, title="t", mark="SIMULATED")))
    plain = Image.open(io.BytesIO(plots.sweep_throughput_png(curves, title="t")))
    assert _count_near(marked, WATERMARK_RGB, tol=6) > 2000 and _count_near(plain, WATERMARK_RGB, tol=6) < 50
    step = plots.tune_step_png([("v01", 1000.0, "incumbent"), ("v02", 1100.0, "kept")], band_pct=1.0, title="t",
                               unit="tok/s", mark="SIMULATED")
    assert _count_near(Image.open(io.BytesIO(step)), WATERMARK_RGB, tol=6) > 2000
    series = [{"label": "v01", "points": [{"tok_s": 900.0, "ttft_ms": 800.0, "itl_ms": 60.0, "met": True},
                                          {"tok_s": 950.0, "ttft_ms": 4000.0, "itl_ms": 90.0, "met": False}],
               "j_per_tok": 1.6, "power_limit_w": 450.0}]
    slo = {"ttft_p99_ms": 3000.0, "itl_p99_ms": 100.0}
    marked = Image.open(io.BytesIO(plots.frontier_png(series, slo=slo, title="t", mark="SIMULATED")))
    plain = Image.open(io.BytesIO(plots.frontier_png(series, slo=slo, title="t")))
    # the plain one's few pink pixels are the red SLO lines' anti-aliased edges
    assert _count_near(marked, WATERMARK_RGB, tol=6) > 2000 > 10 * _count_near(plain, WATERMARK_RGB, tol=6)
    assert marked.size[0] <= 1100  # the report's width (10 in at 100 dpi, its tight box a little more or less)


LAPTOP = (1366, 768)
PLOT_BORDER_RGB = (0xDD, 0xDD, 0xDD)  # the plots' 1 px frame (img { border: 1px solid #ddd })


def test_a_stale_lab_report_shows_the_power_plot_whole_at_1366x768(scratch: Scratch, tmp_path: Path) -> None:
    """The commonest laptop screen, with both notices a changed lab profile carries (LAB and Stale): what ran, the
    verdict and the whole power plot, its frame's bottom edge included, before the fold."""
    assert main(["results", "record", str(scratch.run), "--profile", "glm5-tp8", "--profiles-dir",
                 str(scratch.profiles)]) == 0
    path = scratch.profiles / "glm5-tp8.yaml"
    path.write_text(path.read_text().replace("max_running_requests: 1024", "max_running_requests: 768", 1))
    html_file = tmp_path / "stale.html"
    assert main(["report", "glm5-tp8", "--profiles-dir", str(scratch.profiles), "--html", str(html_file)]) == 0
    text = html_file.read_text()
    assert "<b>Stale:</b>" in text and "Every image below is marked LAB STAND-IN" in text
    img = screenshot(html_file, tmp_path / "laptop.png", tmp_path, LAPTOP)
    assert_first_screen(img)
    limit = _rows_of(img, LIMIT_RGB, tol=40, min_px=150)
    frame = [y for y in _rows_of(img, PLOT_BORDER_RGB, tol=6, min_px=600) if y > limit[0]]
    assert frame, "the power plot's bottom edge is below the fold at 1366x768"


def test_the_terminal_summary_leads_with_the_verdict_and_states_its_clock(scratch: Scratch, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert _report(scratch, "--markdown", str(tmp_path / "r.md")) == 0
    err = capsys.readouterr().err
    assert err.startswith("verdict: busy-but-waiting (confidence 0.85)"), err[:300]
    flat = " ".join(err.split())
    assert "the benchmark: 10-50 s of the probe's clock" in flat and "(35.6 s) of the probe's clock" in flat

"""`toolkit report`: the HTML of a recorded run renders in headless Chromium with its plots, and the pieces.

The Chromium test uses Debian's `chromium` (scripts/debian-packages.txt) with a fresh profile directory and
every background network feature off; the page has no external resources, so nothing leaves the machine.
"""

from __future__ import annotations

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
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
LIMIT_RGB = (0xC0, 0x00, 0x00)  # the enforced-limit line in the power plot (toolkit/adapters/plots.py)
LINE_RGB = (0x1F, 0x77, 0xB4)  # matplotlib's first colour: GPU 0's power line and the throughput line


def _report(s: Scratch, *args: str) -> int:
    assert main(["results", "record", str(s.run), "--profile", "glm5-tp8", "--profiles-dir", str(s.profiles)]) == 0
    return main(["report", "glm5-tp8", "--profiles-dir", str(s.profiles), *args])


def _count_near(img: Image.Image, rgb: tuple[int, int, int], tol: int = 40) -> int:
    px = np.asarray(img.convert("RGB"), dtype=np.int16)
    return int(np.all(np.abs(px - np.array(rgb, dtype=np.int16)) <= tol, axis=-1).sum())


@pytest.mark.slow
def test_html_report_renders_in_headless_chromium_with_its_plots(scratch: Scratch, tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is not installed: run scripts/setup (scripts/debian-packages.txt lists it)")
    html_file = tmp_path / "report.html"
    assert _report(scratch, "--html", str(html_file)) == 0
    text = html_file.read_text()
    assert len(re.findall(r"<img [^>]*src='data:image/png;base64,", text)) == 3
    assert not re.search(r"(src|href)=['\"]https?:", text), "the report must be standalone"
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1200,2600",
         f"--screenshot={shot}", html_file.as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    img = Image.open(shot)
    assert img.size == (1200, 2600)
    colours = img.convert("RGB").getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 200, "a blank (or text-only) page has few colours"
    white = max(colours)[0] / (img.width * img.height)
    assert white < 0.9, f"{white:.0%} of the screenshot is one colour: blank"
    # The plots themselves were drawn: the limit line and the data lines are on the page.
    assert _count_near(img, LIMIT_RGB) > 300, "no enforced-limit line: the power plot did not render"
    assert _count_near(img, LINE_RGB) > 300, "no data lines: the plots did not render"


def test_markdown_report_has_figures_evidence_knobs_and_plot_files(scratch: Scratch, tmp_path: Path) -> None:
    md = tmp_path / "report.md"
    assert _report(scratch, "--markdown", str(md)) == 0
    text = md.read_text()
    assert "Lab data (stand-in)" in text
    assert "| output tokens per joule | 1.795 |" in text
    assert "| gpm.sm_util_pct | 12.2 |" in text  # the verdict's evidence as a table
    assert "~ server.max_running_requests: 64 -> 1024" in text  # knobs that differ from the parent
    for key in ("power", "util-gpm", "throughput"):
        png = tmp_path / f"report-{key}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](report-{key}.png)" in text


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

"""`toolkit upgrade`'s refusals before anything is touched (no host reached). Milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.cli.main import main

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("extra", "said"), [
    (["--sglang-version", "0.5.9"], "already pins SGLang 0.5.9"),
    (["--sglang-version", "0.5.23", "--repeats", "2"], "fewer than 3 pairs decide nothing"),
])
def test_bad_input_is_refused_naming_the_field_before_any_host_is_reached(
        extra: list[str], said: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["upgrade", "glm5-tp8", *extra, "-i", str(tmp_path / "none.yml"),
               "--profiles-dir", str(REPO / "profiles")])
    err = capsys.readouterr().err
    assert rc == 2 and said in err and "--" in err
    assert not (tmp_path / "none.yml").exists()

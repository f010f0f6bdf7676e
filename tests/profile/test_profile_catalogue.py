"""The flag catalogues come from SGLang itself: the static reader on SGLang-shaped source, and (slow,
PyPI) the stored 0.5.9 catalogue regenerated from the real wheel, plus the SM120 patch applied to the
real model_runner.py of that wheel."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from toolkit.adapters.sglang_catalogue import catalogue_path, download_wheel, from_wheel, load_catalogue
from toolkit.core.profile.catalogue import Catalogue, extract_from_source

REPO = Path(__file__).resolve().parents[2]

# The two registration styles SGLang uses (0.5.9's add_argument; 0.5.15's A[...] dataclass fields).
SOURCE = """
CHOICES = ["a", "b"]
MORE = [*CHOICES, "c"]

class ServerArgs:
    tp_size: int = 1
    host: A[str, "The host."] = "127.0.0.1"
    mode: A[Optional[Literal["x", "y"]], Arg(help="Mode.", aliases=["--m"])] = None
    fast: A[bool, "Go fast."] = False
    hidden: A[int, Arg(help="internal", no_cli=True)] = 0

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--tensor-parallel-size", "--tp-size", type=int, default=ServerArgs.tp_size)
        parser.add_argument("--backend", choices=MORE, default="a")
        parser.add_argument("--old-backend", dest="backend", action=DeprecatedAliasStoreAction,
                            new_flag="--backend", choices=MORE)
        parser.add_argument("--enable-thing", action="store_true",
                            help="(Deprecated: use --thing-backend=auto) Enable the thing.")
"""


def test_static_reader_on_both_styles() -> None:
    cat = Catalogue("0.0.0", extract_from_source(SOURCE))
    assert cat.get("--tp-size") is cat.get("--tensor-parallel-size")
    assert cat.get("--tp-size").default == 1
    assert cat.get("--backend").choices == ["a", "b", "c"]
    old = cat.get("--old-backend")
    assert old.deprecated and old.replacement == "--backend"
    thing = cat.get("--enable-thing")
    assert thing.deprecated and thing.replacement == "--thing-backend" and not thing.takes_value
    assert cat.get("--host").default == "127.0.0.1"
    assert cat.get("--m") is cat.get("--mode") and cat.get("--mode").choices == ["x", "y"]
    assert cat.get("--fast").action == "store_true" and not cat.get("--fast").takes_value
    assert cat.get("--hidden") is None
    assert cat.suggest("--tp-sise") == ["--tp-size"]


def test_stored_catalogues_round_trip_and_know_the_seed_flags() -> None:
    for version in ("0.5.9", "0.5.15"):
        data = json.loads(catalogue_path(version).read_text())
        assert Catalogue.from_json(data).to_json() == data
        assert data["source"]["wheel"].startswith(f"sglang-{version}-")
    c = load_catalogue("0.5.9")
    for flag in (
        "--nsa-decode-backend",
        "--nsa-prefill-backend",
        "--enable-flashinfer-allreduce-fusion",
        "--moe-runner-backend",
        "--max-running-requests",
        "--disable-cuda-graph",
        "--disable-radix-cache",
    ):
        assert c.get(flag) is not None and not c.get(flag).deprecated, flag
    assert "trtllm" in c.get("--nsa-decode-backend").choices
    assert c.get("--dsa-decode-backend") is None
    new = load_catalogue("0.5.15")
    assert new.get("--nsa-decode-backend").replacement == "--dsa-decode-backend"


@pytest.fixture(scope="module")
def wheel_0_5_9(tmp_path_factory) -> Path:
    if os.environ.get("TOOLKIT_OFFLINE"):
        pytest.skip("TOOLKIT_OFFLINE set: no PyPI")
    return download_wheel("0.5.9", tmp_path_factory.mktemp("sglang"))


@pytest.mark.slow
def test_regenerated_catalogue_equals_the_stored_one(wheel_0_5_9: Path) -> None:
    stored = json.loads(catalogue_path("0.5.9").read_text())
    assert from_wheel(wheel_0_5_9, "0.5.9").to_json() == stored


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("patch") is None, reason="patch not installed")
def test_sm120_patch_applies_to_the_pinned_model_runner(wheel_0_5_9: Path, shipped, tmp_path: Path) -> None:
    (patch,) = shipped.resolve("glm5-tp8").engine.patches
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(wheel_0_5_9) as zf:
        zf.extract(patch.target, site)
    target = site / patch.target
    assert hashlib.sha256(target.read_bytes()).hexdigest() == patch.target_sha256
    patch_file = REPO / patch.patch
    subprocess.run(["patch", "-p1", "--dry-run", "-i", str(patch_file)], cwd=site, check=True, capture_output=True)
    subprocess.run(["git", "apply", "--check", str(patch_file)], cwd=site, check=True, capture_output=True)
    subprocess.run(["patch", "-p1", "-i", str(patch_file)], cwd=site, check=True, capture_output=True)
    text = target.read_text()
    assert 'autotune_backends.append("flashinfer_cutlass")' in text and "(major, minor) == (12, 0)" in text
    compile(text, str(target), "exec")  # still Python


@pytest.mark.slow
def test_catalogue_command_writes_the_same_json(wheel_0_5_9: Path, tmp_path: Path, capsys) -> None:
    from toolkit.cli.main import main

    argv = [
        "profile",
        "catalogue",
        "--sglang-version",
        "0.5.9",
        "--wheel",
        str(wheel_0_5_9),
        "--out-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0
    assert "331 flags of SGLang 0.5.9" in capsys.readouterr().out
    assert (tmp_path / "0.5.9.json").read_text() == catalogue_path("0.5.9").read_text()


def test_runtime_walk_reads_parser_actions() -> None:
    """The `ServerArgs.add_cli_args(parser)` path, on a parser built the way SGLang builds it."""
    import argparse

    from toolkit.core.profile.catalogue import extract_from_parser

    class DeprecatedAliasStoreAction(argparse.Action):  # SGLang's own name (arg_groups/argparse_actions.py)
        def __init__(self, *args, new_flag: str | None = None, **kwargs) -> None:
            self.new_flag = new_flag
            super().__init__(*args, **kwargs)

        def __call__(self, parser, namespace, values, option_string=None) -> None:  # pragma: no cover
            setattr(namespace, self.dest, values)

    parser = argparse.ArgumentParser()
    parser.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--dsa-decode-backend", choices=["trtllm", "fa3"])
    parser.add_argument(
        "--nsa-decode-backend",
        dest="dsa_decode_backend",
        action=DeprecatedAliasStoreAction,
        new_flag="--dsa-decode-backend",
        default=argparse.SUPPRESS,
    )
    parser.add_argument("--disable-cuda-graph", action="store_true")
    cat = Catalogue("x", extract_from_parser(parser))
    assert cat.get("--tensor-parallel-size").default == 1
    assert cat.get("--dsa-decode-backend").choices == ["trtllm", "fa3"]
    old = cat.get("--nsa-decode-backend")
    assert old.deprecated and old.replacement == "--dsa-decode-backend" and old.default is None
    assert not cat.get("--disable-cuda-graph").takes_value
    assert cat.get("--help") is None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["glm5-baseline", "glm5-tp8", "glm5-tp4-pp2", "glm5-ep8"])
def test_sglang_reads_the_config_yaml_back_into_the_same_flags(
    wheel_0_5_9: Path, shipped, tmp_path: Path, name
) -> None:
    """SGLang's own --config reader (server_args_config_parser.py of the 0.5.9 wheel, which needs only
    argparse and yaml) turns the rendered config YAML into exactly the launch argv's flags."""
    import importlib.util

    from toolkit.core.profile.render import render_launch_argv, render_sglang_config_yaml

    module_path = "sglang/srt/server_args_config_parser.py"
    with zipfile.ZipFile(wheel_0_5_9) as zf:
        zf.extract(module_path, tmp_path)
    spec = importlib.util.spec_from_file_location("sglang_config_parser_0_5_9", tmp_path / module_path)
    assert spec is not None and spec.loader is not None
    parser_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parser_module)
    catalogue = load_catalogue("0.5.9")
    switches = [f.dest for f in catalogue.flags if f.action == "store_true"]
    resolved = shipped.resolve(name)
    config = tmp_path / "config.yaml"
    config.write_text(render_sglang_config_yaml(resolved))
    merged = parser_module.ConfigArgumentMerger(boolean_actions=switches).merge_config_with_args(
        ["--config", str(config)]
    )
    assert merged == render_launch_argv(resolved)[3:]


@pytest.mark.slow
def test_bench_argv_flags_exist_in_the_pinned_bench_serving(wheel_0_5_9: Path, write_profiles, base_yaml) -> None:
    """Every flag render_bench_argv can emit is one that 0.5.9's sglang/bench_serving.py defines."""
    from toolkit.core.profile.render import render_bench_argv

    with zipfile.ZipFile(wheel_0_5_9) as zf:
        bench = Catalogue("0.5.9", extract_from_source(zf.read("sglang/bench_serving.py").decode()))
    every = "bench:\n  random_range_ratio: 1.0\n  max_concurrency: 64\n  warmup_requests: 4\n  seed: 1\n"
    store = write_profiles({"base": base_yaml, "c": "schema_version: 1\nname: c\nextends: base\n" + every})
    argv = render_bench_argv(store.resolve("c"), base_url="http://127.0.0.1:8000", output_file="o.jsonl")
    flags = [a for a in argv if a.startswith("--")]
    assert {"--random-range-ratio", "--max-concurrency", "--warmup-requests", "--seed"} <= set(flags)
    assert [f for f in flags if bench.get(f) is None] == []

"""The flag catalogues come from SGLang itself: the static reader on SGLang-shaped source of each layout, the shipped
catalogues of every release from 0.5.9 on, the refusal of an extraction that finds too little, and (slow, PyPI once,
then the wheel cache) a sample of real releases regenerated from their own wheels."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from toolkit.adapters.sglang_catalogue import (
    available_versions,
    catalogue_path,
    ensure_wheel,
    from_wheel,
    load_catalogue,
    regenerate,
)
from toolkit.core.errors import ToolkitError
from toolkit.core.profile.catalogue import (
    CORE_FLAGS,
    Catalogue,
    extract_from_source,
    extract_from_sources,
    parser_prog,
    plausibility_problems,
    removed_between,
)

REPO = Path(__file__).resolve().parents[2]

# Every release on PyPI from the GLM-5 pin on. Per release: flags, deprecated flags, and the state of
# --nsa-decode-backend --dsa-decode-backend --disable-cuda-graph --cuda-graph-max-bs --cuda-graph-backend-decode
# --enable-flashinfer-allreduce-fusion --enable-dp-attention (+ live, D deprecated, - absent). The figures are those
# of the runtime walk (ServerArgs.add_cli_args on an argparse parser, each release imported on a CPU machine:
# benchmarks/check_catalogues_against_sglang.py), which the static reader matched flag for flag.
RELEASES = {
    "0.5.9": (331, 2, "+-++-++"),
    "0.5.10": (354, 5, "+-++-++"),
    "0.5.10.post1": (354, 5, "+-++-++"),
    "0.5.11": (374, 6, "+-++-++"),
    "0.5.12": (387, 6, "+-++-++"),
    "0.5.12.post1": (387, 6, "+-++-++"),
    "0.5.13": (406, 10, "D+++-++"),
    "0.5.13.post1": (406, 10, "D+++-++"),
    "0.5.14": (420, 23, "D+DD+D+"),
    "0.5.15": (437, 23, "D+DD+D+"),
    "0.5.15.post1": (437, 23, "D+DD+D+"),
    "0.5.16": (460, 26, "D+DD+D+"),
    "0.5.17": (474, 27, "D+DD+D+"),
    "0.5.18": (488, 29, "D+DD+D+"),
    "0.5.19": (503, 29, "D+DD+D+"),
    "0.5.20": (494, 6, "-+D-+D+"),
    "0.5.21": (512, 4, "-+D-+D+"),
    "0.5.22": (521, 5, "-+D-+DD"),
    "0.5.23": (531, 6, "-+D-+DD"),
}
WATCHED = ("--nsa-decode-backend", "--dsa-decode-backend", "--disable-cuda-graph", "--cuda-graph-max-bs",
           "--cuda-graph-backend-decode", "--enable-flashinfer-allreduce-fusion", "--enable-dp-attention")


def _state(cat: Catalogue) -> str:
    return "".join("-" if cat.get(f) is None else "D" if cat.get(f).deprecated else "+" for f in WATCHED)


# ---- the reader, on source shaped like each layout ----------------------------------------------

# 0.5.9-0.5.13: add_argument calls; 0.5.14-0.5.19: A[...] fields of ServerArgs (registered first).
SOURCE = """
CHOICES = ["a", "b"]
MORE = [*CHOICES, "c"]

class ServerArgs:
    tp_size: int = 1
    host: A[str, "The host."] = "127.0.0.1"
    mode: A[Optional[Literal["x", "y"]], Arg(help="Mode.", aliases=["--m"])] = None
    fast: A[bool, "Go fast."] = False
    hidden: A[int, Arg(help="internal", no_cli=True)] = 0
    model_path: A[str, Arg(help="The model.", aliases=["--model"])]
    sizes: A[Optional[List[int]], "Sizes."] = None

    @staticmethod
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument("--tensor-parallel-size", "--tp-size", type=int, default=ServerArgs.tp_size)
        parser.add_argument("--backend", choices=MORE, default="a")
        parser.add_argument("--old-backend", dest="backend", action=DeprecatedAliasStoreAction,
                            new_flag="--backend", choices=MORE)
        parser.add_argument("--enable-thing", action="store_true",
                            help="(Deprecated: use --thing-backend=auto) Enable the thing.")
        parser.add_argument("--gone", action=DeprecatedAction, error_message="Removed. Use --new.")
        parser.add_argument("--window", type=int, default=1024 * 1024)

def prepare_server_args(argv):
    parser = argparse.ArgumentParser(prog="sglang serve")
"""


def test_static_reader_on_add_argument_and_serverargs_fields() -> None:
    flags = extract_from_source(SOURCE)
    cat = Catalogue("0.0.0", flags)
    # add_cli_args_from_dataclass runs first: fields in declaration order, then the add_argument calls.
    assert [f.names[0] for f in flags] == ["--host", "--mode", "--fast", "--model-path", "--sizes",
                                          "--tensor-parallel-size", "--backend", "--old-backend", "--enable-thing",
                                          "--gone", "--window"]
    assert cat.get("--tp-size") is cat.get("--tensor-parallel-size")
    assert cat.get("--tp-size").default == 1 and cat.get("--tp-size").type == "int"
    assert cat.get("--backend").choices == ["a", "b", "c"]
    old = cat.get("--old-backend")
    assert old.deprecated and old.replacement == "--backend" and old.takes_value
    thing = cat.get("--enable-thing")
    assert thing.deprecated and thing.replacement == "--thing-backend" and not thing.takes_value
    assert thing.default is False  # argparse's for a store_true given none
    assert cat.get("--gone").error == "Removed. Use --new." and cat.get("--gone").nargs == 0
    assert cat.get("--window").default == 1048576
    assert cat.get("--host").default == "127.0.0.1"
    assert cat.get("--m") is cat.get("--mode") and cat.get("--mode").choices == ["x", "y"]
    assert cat.get("--fast").action == "store_true" and not cat.get("--fast").takes_value
    assert cat.get("--model").required and not cat.get("--host").required  # no default: argparse requires it
    assert cat.get("--sizes").nargs == "+" and cat.get("--sizes").type == "int"
    assert cat.get("--hidden") is None
    assert cat.suggest("--tp-sise")[0] == "--tp-size"
    assert parser_prog({"sglang/srt/server_args.py": SOURCE}) == "sglang serve"


# 0.5.20+: the fields live in namespace classes of arg_groups/fields/, choices in arg_groups/choices.py, and
# collect_input_fields orders them by POSITIONAL_FIELD_ORDER first.
NAMESPACED = {
    "sglang/srt/server_args.py": """
from sglang.srt.arg_groups.fields.parallel import Parallel
from sglang.srt.arg_groups.fields.serving import Serving
from sglang.srt.arg_groups.choices import SAMPLING_CHOICES

class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        choices = set(SAMPLING_CHOICES)
        parser.add_argument("--sampling-backend", choices=choices, default=_declared_default("sampling"))
        parser.add_argument("--disable-cuda-graph", action=DeprecatedStoreTrueAction,
                            new_flag="--cuda-graph-backend-{decode,prefill}=disabled", help="Deprecated.")

_INPUT_NAMESPACES = [Serving, Parallel]
""",
    "sglang/srt/arg_groups/choices.py": (
        'BACKENDS = ["full", "disabled"]\nSAMPLING_CHOICES = {"pytorch", "flashinfer"}\n'
    ),
    "sglang/srt/arg_groups/field_order.py": 'POSITIONAL_FIELD_ORDER = ("tp_size", "sampling", "host")\n',
    "sglang/srt/arg_groups/fields/parallel.py": """
from sglang.srt.arg_groups.choices import BACKENDS

class Parallel(msgspec.Struct):
    _NS_PATH = "parallel"
    tp_size: A[int, Arg(help="TP.", aliases=["--tensor-parallel-size"])] = 1
    graph: A[Optional[str], Arg(help="Graph.", choices=BACKENDS)] = None
    rank: A[int, Derived(doc="set at run time")] = 0
    tf32: A[Optional[bool], Arg(help="TF32.", action=argparse.BooleanOptionalAction)] = None
    loras: A[Optional[list], Arg(help="LoRA.", action=LoRAPathAction, action_kwargs={"type": str, "nargs": "*"})] = None
""",
    "sglang/srt/arg_groups/fields/serving.py": """
class Serving(msgspec.Struct):
    _NS_PATH = "serving"
    host: A[str, "Host."] = "127.0.0.1"
    sampling: A[Optional[str], Arg(help="x", no_cli=True)] = "flashinfer"
    tags: A[List[str], "Tags."] = msgspec.field(default_factory=list)
""",
}


def test_static_reader_follows_the_namespace_layout() -> None:
    flags = extract_from_sources(NAMESPACED)
    cat = Catalogue("0.0.0", flags)
    assert [f.names[0] for f in flags] == ["--tp-size", "--host", "--tags", "--graph", "--tf32", "--loras",
                                          "--sampling-backend", "--disable-cuda-graph"]
    assert cat.get("--graph").choices == ["full", "disabled"]  # resolved from arg_groups/choices.py
    assert cat.get("--tensor-parallel-size").dest == "tp_size"
    assert cat.get("--no-tf32") is cat.get("--tf32") and cat.get("--tf32").nargs == 0
    assert cat.get("--loras").nargs == "*" and cat.get("--loras").type == "str"
    assert cat.get("--tags").default == [] and cat.get("--tags").nargs == "+"
    assert cat.get("--rank") is None  # Derived: no CLI
    sampling = cat.get("--sampling-backend")
    assert sampling.choices == ["flashinfer", "pytorch"] and sampling.default == "flashinfer"
    cuda = cat.get("--disable-cuda-graph")
    assert cuda.deprecated and cuda.replacement == "--cuda-graph-backend-{decode,prefill}=disabled"
    assert parser_prog(NAMESPACED) == "launch_server.py"  # argparse's default for python -m sglang.launch_server


def test_too_little_is_no_catalogue() -> None:
    flags = extract_from_sources({"sglang/srt/server_args.py": NAMESPACED["sglang/srt/server_args.py"]})
    problems = plausibility_problems(flags)
    assert "the core flags --model-path, --tp-size, --host, --port" in problems[0]
    assert "implausibly few" in problems[1]


def _fake_wheel(tmp_path: Path, files: dict[str, str], version: str = "9.9.9") -> Path:
    wheel = tmp_path / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return wheel


def test_a_release_whose_extraction_breaks_exits_2_and_writes_nothing(tmp_path: Path, capsys) -> None:
    """The issue's case: a layout that leaves server_args.py with a handful of flags (0.5.20+ read the old way)."""
    from toolkit.cli.main import main

    text = "def add_cli_args(parser):\n" + "".join(
        f"    parser.add_argument('--flag-{i}', type=int)\n" for i in range(9)
    )
    wheel = _fake_wheel(tmp_path, {"sglang/srt/server_args.py": text})
    with pytest.raises(ToolkitError) as err:
        from_wheel(wheel, "9.9.9")
    assert err.value.exit_code == 2
    assert "gave 9 flags from 1 files" in str(err.value) and "--model-path" in str(err.value)
    out = tmp_path / "out"
    code = main(["profile", "catalogue", "--sglang-version", "9.9.9", "--wheel", str(wheel), "--out-dir", str(out)])
    assert code == 2 and not out.exists()
    assert "Nothing was written" in capsys.readouterr().err
    with pytest.raises(ToolkitError, match=r"has no sglang/srt/server_args\.py"):
        from_wheel(_fake_wheel(tmp_path, {"sglang/other.py": ""}, "9.9.8"), "9.9.8")


# ---- the shipped catalogues -------------------------------------------------------------------


def test_every_release_from_the_pin_on_is_shipped() -> None:
    assert available_versions() == list(RELEASES)


@pytest.mark.parametrize("version", list(RELEASES))
def test_shipped_catalogue(version: str) -> None:
    data = json.loads(catalogue_path(version).read_text())
    cat = Catalogue.from_json(data)
    assert cat.to_json() == data  # schema 2, stable
    flags, deprecated, state = RELEASES[version]
    assert (len(cat.flags), sum(f.deprecated for f in cat.flags), _state(cat)) == (flags, deprecated, state)
    assert plausibility_problems(cat.flags) == [] and all(cat.get(f) for f in CORE_FLAGS)
    source = cat.source
    assert source["wheel"].startswith(f"sglang-{version}-") and len(source["wheel_sha256"]) == 64
    assert source["files_read"] >= 1 and len(source["files_sha256"]) == 64
    assert cat.prog == ("launch_server.py" if version == "0.5.9" else "sglang serve")


def test_choices_and_renames_across_releases() -> None:
    old, mid, new = load_catalogue("0.5.9"), load_catalogue("0.5.15"), load_catalogue("0.5.23")
    assert "trtllm" in old.get("--nsa-decode-backend").choices and "nsa" in old.get("--attention-backend").choices
    assert mid.get("--nsa-decode-backend").replacement == "--dsa-decode-backend"
    assert mid.get("--cuda-graph-max-bs").replacement == "--cuda-graph-max-bs-decode"
    assert mid.get("--cuda-graph-backend-decode").choices == ["full", "breakable", "tc_piecewise", "disabled"]
    assert new.get("--cuda-graph-backend-decode").choices == ["full", "breakable", "disabled"]
    assert "flashinfer_sparse_mla" in new.get("--dsa-decode-backend").choices
    assert new.get("--enable-dp-attention").replacement == "--attn-dp-size <dp-size>"
    assert new.get("--model-path").required and new.get("--tp-size").type == "int"
    gone = removed_between(load_catalogue("0.5.19"), load_catalogue("0.5.20"))
    assert {"--nsa-decode-backend", "--nsa-prefill-backend", "--cuda-graph-max-bs"} <= set(gone)


def test_the_release_tables_in_the_docs_are_current() -> None:
    """docs/profiles.md's "SGLang releases" section is what scripts/sglang_releases_doc.py writes from the data."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts/sglang_releases_doc.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_schema_1_is_migrated_on_read() -> None:
    v1 = {"schema_version": 1, "sglang_version": "0.0.1", "source": {},
          "flags": [{"names": ["--x"], "dest": "x", "action": "store_true", "choices": None, "default": False,
                     "deprecated": False, "replacement": None, "takes_value": False},
                    {"names": ["--y"], "dest": "y", "action": None, "choices": None, "default": None,
                     "deprecated": False, "replacement": None, "takes_value": True}]}
    cat = Catalogue.from_json(v1)
    assert cat.get("--x").nargs == 0 and cat.get("--y").nargs is None and cat.prog == "launch_server.py"
    with pytest.raises(ValueError, match="schema_version 3"):
        Catalogue.from_json({**v1, "schema_version": 3})


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
    assert cat.get("--tensor-parallel-size").default == 1 and cat.get("--tp-size").type == "int"
    assert cat.get("--dsa-decode-backend").choices == ["trtllm", "fa3"]
    old = cat.get("--nsa-decode-backend")
    assert old.deprecated and old.replacement == "--dsa-decode-backend" and old.default is None
    assert not cat.get("--disable-cuda-graph").takes_value and cat.get("--disable-cuda-graph").action == "store_true"
    assert cat.get("--help") is None


# ---- real releases, from their own wheels (slow: PyPI once, then /var/cache/toolkit/sglang-wheels) ----------


def _wheel(version: str) -> Path:
    if os.environ.get("TOOLKIT_OFFLINE"):
        pytest.skip("TOOLKIT_OFFLINE set: no PyPI")
    try:
        return ensure_wheel(version)
    except ToolkitError as err:
        pytest.skip(f"sglang {version}'s wheel is not cached and PyPI did not give it: {err}")


@pytest.fixture(scope="module")
def wheel_0_5_9() -> Path:
    return _wheel("0.5.9")


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.9", "0.5.15", "0.5.23"])  # the oldest, one of each layout, the newest
def test_a_real_release_extracts_to_the_shipped_catalogue(version: str, tmp_path: Path) -> None:
    wheel = _wheel(version)
    shipped = json.loads(catalogue_path(version).read_text())
    # The Python source is the same in every wheel of a release (cp311, cp313): its digest must match the
    # stored one, and the wheel's own hash where it is the stored wheel.
    fresh = from_wheel(wheel, version).to_json()
    assert fresh["source"]["files_sha256"] == shipped["source"]["files_sha256"]
    if wheel.name == shipped["source"]["wheel"]:
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() == shipped["source"]["wheel_sha256"]
    assert fresh["flags"] == shipped["flags"] and fresh["prog"] == shipped["prog"]
    cat = Catalogue.from_json(fresh)
    flags, deprecated, state = RELEASES[version]
    assert (len(cat.flags), sum(f.deprecated for f in cat.flags), _state(cat)) == (flags, deprecated, state)
    assert all(cat.get(f) for f in CORE_FLAGS) and "flashinfer_cutlass" in cat.get("--moe-runner-backend").choices


@pytest.mark.slow
def test_catalogue_command_writes_the_whole_newest_catalogue(tmp_path: Path, capsys) -> None:
    from toolkit.cli.main import main

    _wheel("0.5.23")
    assert main(["profile", "catalogue", "--sglang-version", "0.5.23", "--out-dir", str(tmp_path)]) == 0
    assert "531 flags of SGLang 0.5.23 (6 deprecated)" in capsys.readouterr().out
    written = json.loads((tmp_path / "0.5.23.json").read_text())
    assert written["flags"] == json.loads(catalogue_path("0.5.23").read_text())["flags"]
    path, _ = regenerate("0.5.23", out_dir=tmp_path / "again")
    assert path.read_text() == (tmp_path / "0.5.23.json").read_text()


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
def test_the_patch_is_upstream_where_it_says(shipped) -> None:
    """SGLang autotunes flashinfer_cutlass itself from the release the patch's `upstream` names, not before."""
    (patch,) = shipped.resolve("glm5-tp8").engine.patches
    assert patch.upstream is not None and patch.upstream.release == "0.5.13"

    def autotune_list(version: str) -> str:
        with zipfile.ZipFile(_wheel(version)) as zf:
            text = zf.read(patch.target).decode()
        body = text[text.index("def _should_run_flashinfer_autotune"):]
        return body[: body.index("major, _ = torch.cuda.get_device_capability()")]

    assert '# "flashinfer_cutlass",' in autotune_list("0.5.12")
    assert '    "flashinfer_cutlass",\n' in autotune_list("0.5.13").replace('# "flashinfer_cutlass"', "")


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
@pytest.mark.parametrize(("version", "module"), [("0.5.9", "sglang/bench_serving.py"),
                                                 ("0.5.23", "sglang/benchmark/serving.py")])
def test_bench_argv_flags_exist_in_the_pinned_bench_serving(version: str, module: str, write_profiles,
                                                            base_yaml) -> None:
    """Every flag render_bench_argv can emit is one that the release's bench_serving defines (0.5.23 keeps
    `python -m sglang.bench_serving` as a deprecated path to sglang.benchmark.serving)."""
    from toolkit.core.profile.render import render_bench_argv

    with zipfile.ZipFile(_wheel(version)) as zf:
        bench = Catalogue(version, extract_from_source(zf.read(module).decode()))
        if version != "0.5.9":
            assert "from sglang.benchmark.serving import cli_main" in zf.read("sglang/bench_serving.py").decode()
    every = "bench:\n  random_range_ratio: 1.0\n  max_concurrency: 64\n  warmup_requests: 4\n  seed: 1\n"
    store = write_profiles({"base": base_yaml, "c": "schema_version: 1\nname: c\nextends: base\n" + every})
    argv = render_bench_argv(store.resolve("c"), base_url="http://127.0.0.1:8000", output_file="o.jsonl")
    flags = [a for a in argv if a.startswith("--")]
    assert {"--random-range-ratio", "--max-concurrency", "--warmup-requests", "--seed"} <= set(flags)
    assert [f for f in flags if bench.get(f) is None] == []


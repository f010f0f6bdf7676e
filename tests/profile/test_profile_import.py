"""A profile from what a running server reports (core/profile/importer.py): pure, over /server_info answers."""

from __future__ import annotations

import yaml

from toolkit.adapters.sglang_catalogue import load_catalogue
from toolkit.core.profile.importer import profile_from_server

CAT = load_catalogue("0.5.9")


def _info(**over: object) -> dict[str, object]:
    # SGLang's /server_info: dataclasses.asdict(ServerArgs) at the top level, beside version and internal_states.
    assert CAT is not None
    args: dict[str, object] = {f.names[-1].lstrip("-").replace("-", "_"): f.default
                               for f in (CAT.get(n) for n in CAT.names()) if f}
    return {**args, "model_path": "zai-org/GLM-4.5-Air", "version": "0.5.9", "internal_states": [{}], **over}


def _import(info: dict[str, object], command: tuple[str, ...] = ()) -> tuple[dict[str, object], list[str]]:
    imported = profile_from_server(info, name="mine", source="http://h:30000", date="2026-12-06", version=None,
                                   catalogue=CAT, command=command, target={"gpu_count": 8,
                                                                           "compute_capability": "SM90"})
    return yaml.safe_load(imported.text), imported.notes


def test_only_what_differs_from_the_release_default_is_written_each_with_its_source() -> None:
    spec, _ = _import(_info(tp_size=8, max_running_requests=256, disable_cuda_graph=True, disable_radix_cache=False,
                            attention_backend="fa3"))
    server = spec["server"]
    assert {k: server[k] for k in ("tp_size", "max_running_requests", "cuda_graph", "attention_backend")} == {
        "tp_size": 8, "max_running_requests": 256, "cuda_graph": False, "attention_backend": "fa3"}
    assert "radix_cache" not in server and "mem_fraction_static" not in server  # the release's defaults
    assert spec["engine"] == {"sglang_version": "0.5.9"} and spec["target"]["gpu_count"] == 8
    assert spec["why"]["server.tp_size"]["reason"].startswith("--tp-size 8 on the running server (read from "
                                                              "http://h:30000 /server_info on 2026-12-06)")


def test_the_api_key_is_never_copied_and_the_rest_of_the_command_line_goes_to_extra_args() -> None:
    spec, notes = _import(_info(api_key="sk-secret"), ("python", "-m", "sglang.launch_server", "--model-path", "m",
                                                       "--api-key", "sk-secret", "--schedule-policy=lpm",
                                                       "--tp-size", "8", "--enable-mixed-chunk"))
    assert "sk-secret" not in yaml.safe_dump(spec)
    assert spec["server"]["api_key_secret"] == "env:SGLANG_API_KEY"
    assert spec["server"]["extra_args"] == ["--schedule-policy", "lpm", "--enable-mixed-chunk"]
    assert any("--api-key" in n for n in notes)


def test_a_version_that_is_no_release_is_left_out_and_said() -> None:
    spec, notes = _import(_info(version="not installed"))
    assert "engine" not in spec and any("--sglang-version" in n for n in notes)

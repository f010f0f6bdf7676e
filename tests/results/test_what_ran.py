"""A results entry records what ran, not what the profile asked: the lab's 160 prompts against the profile's 1024."""

from __future__ import annotations

import json

from tests.results.conftest import Scratch
from toolkit.app.record import load_results, record_run

LAB_ARGV = ["/opt/sglang/venv/bin/python", "-m", "sglang.bench_serving", "--backend", "sglang-oai", "--base-url",
            "http://127.0.0.1:8000", "--dataset-name", "random", "--num-prompts", "160", "--random-input-len", "256",
            "--random-output-len", "128", "--request-rate", "inf", "--output-file", "/x/bench.jsonl",
            "--api-key", "sk-secret"]


def _as_lab_run(s: Scratch, completed: int) -> None:
    run = json.loads((s.run / "run.json").read_text())
    run["command"] = LAB_ARGV
    (s.run / "run.json").write_text(json.dumps(run))
    bench = json.loads((s.run / "bench.jsonl").read_text())
    bench.pop("seed", None)
    bench["completed"] = completed
    (s.run / "bench.jsonl").write_text(json.dumps(bench) + "\n")


def test_num_prompts_is_what_completed_and_the_profile_is_kept_apart(scratch: Scratch) -> None:
    _as_lab_run(scratch, 158)
    record_run(scratch.run, "glm5-tp8", scratch.profiles)
    entry = load_results("glm5-tp8", scratch.profiles).block.entries[-1]
    b = entry.bench
    assert b.num_prompts == 158 and b.failed == 2  # 160 asked of the benchmark, 158 completed
    assert b.profile_asked == {"num_prompts": 1024}  # the profile's wish, where the run differs
    assert b.seed == 1  # bench_serving's default: the command gave none, so the profile's is not what ran
    assert b.command is not None and "--num-prompts 160" in b.command and "sk-secret" not in b.command
    assert "--api-key '***'" in b.command


def test_secret_looking_flags_are_whole_words() -> None:
    from toolkit.core.text import redact_argv

    argv = ["x", "--tokenizer", "/t", "--hf-token", "hf_1", "--api-key=k", "--max-total-tokens", "9", "--password", "p"]
    assert redact_argv(argv) == ["x", "--tokenizer", "/t", "--hf-token", "***", "--api-key=***",
                                 "--max-total-tokens", "9", "--password", "***"]

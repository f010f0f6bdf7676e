"""NCCL's all-reduce between the hosts, judged before the model loads: nccl-tests' own output format read by the
one parser, for the real tool and the lab's stand-in alike."""

from __future__ import annotations

from toolkit.core import nccl

# nccl-tests' all_reduce_perf over two hosts of one GPU each, NCCL_DEBUG=INFO, as its src/common.cu prints it.
IB_RUN = """\
# nThread 1 nGpus 1 minBytes 8 maxBytes 268435456 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 \
validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  41213 on      gpu-a device  0 [0x01] NVIDIA RTX PRO 6000 Blackwell Server Edition
#  Rank  1 Group  0 Pid  39857 on      gpu-b device  0 [0x01] NVIDIA RTX PRO 6000 Blackwell Server Edition
gpu-a:41213:41213 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.11<0>
gpu-a:41213:41213 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    21.43    0.00    0.00      0    20.98    0.00    0.00      0
          16             4     float     sum      -1    21.10    0.00    0.00      0    21.05    0.00    0.00      0
   268435456      67108864     float     sum      -1    24873   10.79   10.79      0    24810   10.82   10.82      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 3.59767
#
"""


def test_an_rdma_run_reads_its_latency_bandwidth_and_network() -> None:
    result = nccl.parse(IB_RUN)
    assert result.latency_us == 21.43 and result.busbw_gbps == 10.79 and result.avg_busbw_gbps == 3.59767
    assert result.transport == "IB" and result.hosts == ("gpu-a", "gpu-b") and result.out_of_bounds == 0
    verdict = nccl.judge(result, expected_ranks=2, hosts=["gpu-a", "gpu-b"])
    assert verdict.ok and verdict.kind == "ok" and "21.4 us" in verdict.text and "10.79 GB/s" in verdict.text


def test_a_socket_run_is_named_tcp_only_and_goes_on() -> None:
    text = (IB_RUN.replace("NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.11<0>",
                           "NET/Socket : Using [0]eth0:10.0.0.11<0>")
            .replace("via NET/IB/0", "via NET/Socket/0").replace("10.79   10.79", " 2.31    2.31"))
    verdict = nccl.judge(nccl.parse(text), expected_ranks=2, hosts=["gpu-a", "gpu-b"])
    assert verdict.ok and verdict.kind == "tcp-only"
    assert "NET/Socket, [0]eth0:10.0.0.11<0>" in verdict.text and "2.31 GB/s" in verdict.text


def test_wrong_values_a_missing_rank_or_an_nccl_failure_stop_the_deploy() -> None:
    wrong = IB_RUN.replace("10.79   10.79      0", "10.79   10.79      3")
    assert nccl.judge(nccl.parse(wrong), expected_ranks=2, hosts=["a", "b"]).kind == "misconfigured"
    missing = nccl.judge(nccl.parse(IB_RUN), expected_ranks=16, hosts=["a", "b"])
    assert not missing.ok and "2 rank(s) joined" in missing.text
    failed = ("gpu-a:1:1 [0] NCCL INFO Bootstrap : Using eth9\ngpu-a:1:1 [0] NCCL WARN Bootstrap : no socket "
              "interface found\ngpu-a: Test NCCL failure common.cu:1005 'unhandled system error'\n")
    verdict = nccl.judge(nccl.parse(failed), expected_ranks=2, hosts=["a", "b"], rc=1)
    assert not verdict.ok and "no socket interface found" in verdict.text
    assert nccl.judge(nccl.parse(""), expected_ranks=2, hosts=["a", "b"]).kind == "misconfigured"


def test_the_command_runs_every_gpu_of_every_host_under_mpirun() -> None:
    argv = nccl.command(["10.0.0.11", "10.0.0.12"], 8)
    assert argv[:5] == ["mpirun", "--allow-run-as-root", "-np", "16", "-H"]
    assert argv[5] == "10.0.0.11:8,10.0.0.12:8" and "NCCL_SOCKET_IFNAME" in argv
    assert argv[argv.index("all_reduce_perf"):] == ["all_reduce_perf", "-b", "8", "-e", "268435456", "-f", "2",
                                                    "-g", "1"]


def test_the_lab_stand_in_prints_what_the_same_parser_reads_and_refuses_what_nccl_refuses() -> None:
    """The stand-in runs with the real command line after it; its output is read by nccl.parse like the real one."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    standin = Path(__file__).resolve().parents[2] / "toolkit/lab/standins/all_reduce_perf"
    argv = [sys.executable, str(standin), *nccl.command(["localhost", "localhost"], 1)]
    argv[argv.index(str(nccl.MAX_BYTES))] = str(1024 * 1024)  # a short sweep: the format is the point
    env = {**os.environ, "NCCL_SOCKET_IFNAME": "lo"}
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True, timeout=60).stdout
    result = nccl.parse(out)
    assert result.standin and result.transport == "Socket" and len(result.ranks) == 2
    assert [r.size_b for r in result.rows][:2] == [8, 16] and result.rows[-1].size_b == 1024 * 1024
    verdict = nccl.judge(result, expected_ranks=2, hosts=["localhost"])
    assert verdict.kind == "tcp-only" and "stand-in" in verdict.notes[0]
    bad = subprocess.run(argv, capture_output=True, text=True, env={**env, "NCCL_SOCKET_IFNAME": "eth9"},
                         check=False, timeout=60)
    assert bad.returncode != 0
    failed = nccl.judge(nccl.parse(bad.stdout), expected_ranks=2, hosts=["localhost"], rc=bad.returncode)
    assert failed.kind == "misconfigured" and "no socket interface found" in failed.text
    over = [*argv]
    over[over.index("-np") + 1] = "4"
    refused = subprocess.run(over, capture_output=True, text=True, env=env, check=False, timeout=60)
    assert refused.returncode == 1 and "not enough slots" in refused.stderr

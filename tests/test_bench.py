"""`angpt bench step`: the peer arm is the same model as our GPT+, and the table has every column filled."""

import sys
from pathlib import Path

import pytest
import torch

from angpt.bench.step import Qwen3Peer, bench_step, format_table
from angpt.hf.qwen3 import gpt_from_qwen3_state_dict
from angpt.train.hardware import matmul_peak


def test_qwen3_peer_is_our_gpt_plus():
    """The peer arm computes the same loss as our GPT+ with its weights: the comparison is of implementations."""
    torch.manual_seed(0)
    peer = Qwen3Peer("tiny")
    ours = gpt_from_qwen3_state_dict(peer.config, peer.hf.state_dict())
    x = torch.randint(0, peer.config.vocab_size, (2, 33))
    with torch.no_grad():
        a = peer(x[:, :-1], x[:, 1:])[1]
        b = ours(x[:, :-1], x[:, 1:])[1]
    assert torch.allclose(a, b, atol=1e-5)
    assert peer.flops_per_token(64) == ours.flops_per_token(64)


def test_bench_step_table(monkeypatch):
    rows = bench_step(["gpt+", "qwen3", "angpt"], "tiny", batch_size=2, seq_len=16, warmup=0, reps=1)
    assert [r.arch for r in rows] == ["gpt+", "qwen3", "angpt"] and rows[0].train_ratio == 1.0
    assert all(r.train_ms > 0 and r.infer_ms > 0 and 0 < r.peak_fraction for r in rows)
    table = format_table(rows)
    assert table.count("\n") == 4 and "qwen3" in table


def test_compiled_arms_start_afresh_with_room_under_dynamos_recompile_limit(monkeypatch):
    """Our arms share one forward code object that Dynamo compiles once per model: with its default limit of 8 an
    earlier shape of the same process made the 2026-11-27 loan's 0.5B nGPT arm run eagerly. Each compiled
    bench_step resets Dynamo and compiles every model under a limit with room for all arms (torch.compile stubbed:
    on a CPU each compile costs seconds)."""
    import torch._dynamo

    from angpt.bench import step as bench

    seen, resets = [], []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))

    projected = []

    def compile(model, **kwargs):
        if isinstance(model, torch.nn.Module):
            seen.append(torch._dynamo.config.recompile_limit)
            return model
        return lambda *a: projected.append(1) or model(*a)  # the weight constraint's projection

    monkeypatch.setattr(bench.torch, "compile", compile)
    archs = ["gpt+", "ngpt", "angpt", "gpt+[n_layers=1]"]
    rows = bench.bench_step(archs, "tiny", batch_size=1, seq_len=8, warmup=0, reps=1, compile=True)
    assert len(seen) == 2 * len(archs) and min(seen) >= 4 * len(archs)
    assert resets == [1, 1]  # before, and after: the next shape's arms find none of this one's graphs
    assert torch._dynamo.config.recompile_limit == 8  # restored after
    # the compiled constraint runs after each step and again for its own timing (the eager one beside it)
    assert rows[2].constraint_ms is not None and len(projected) >= 2 * (1 + 6)
    bench.bench_step(archs[:1], "tiny", batch_size=1, seq_len=8, warmup=0, reps=1, compile=False)
    assert resets == [1, 1]


def test_the_bench_times_the_weight_constraint_beside_the_step():
    """Each arm with a weight constraint reports its time after a step, as the step runs it and eager (compiled runs
    compile it; the H200's profile put anGPT's excess there); GPT+ and the peer have none."""
    rows = bench_step(["gpt+", "angpt", "ngpt", "qwen3"], "tiny", batch_size=1, seq_len=8, warmup=0, reps=1)
    by = {r.arch: r for r in rows}
    assert by["gpt+"].constraint_ms is None and by["qwen3"].constraint_ms is None
    for arch in ("angpt", "ngpt"):
        assert by[arch].constraint_ms > 0 and by[arch].constraint_ms == by[arch].constraint_eager_ms  # eager run
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
    import report

    line = report._constraint_line([{**vars(r), "constraint_ms": 0.4} if r.arch == "angpt" else vars(r) for r in rows])
    assert line == [
        "- the weight constraint after each step, as the step runs it: angpt 0.40 ms (eager "
        f"{by['angpt'].constraint_eager_ms:.2f}), ngpt {by['ngpt'].constraint_ms:.2f} ms (eager "
        f"{by['ngpt'].constraint_eager_ms:.2f})"
    ]


def test_matmul_peak_is_a_rate():
    assert 1e8 < matmul_peak("fp32", torch.device("cpu"), n=256, reps=2) < 1e14


def test_the_cpu_peak_outlasts_a_slow_start(monkeypatch):
    """A 2-core VM can run a process's first dozen matmuls at half speed; the measured CPU peak keeps timing for
    CPU_PEAK_SECONDS, so it reads the full speed that follows (the best of six matmuls read half of it: 197 GFLOP/s
    for 380). Stubbed clock: the first 12 matmuls take 2 ms, the rest 1 ms; CPU_PEAK_SECONDS is 50 ms here, not
    300: the matmuls themselves are real, ~15 ms each."""
    from angpt.train import hardware

    clock, syncs = [0.0], [0]

    def sync(device):  # called before and after each matmul: the second call ends it
        syncs[0] += 1
        if syncs[0] % 2 == 0:
            clock[0] += 0.002 if syncs[0] <= 24 else 0.001

    monkeypatch.setattr(hardware, "_sync", sync)
    monkeypatch.setattr(hardware.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(hardware, "CPU_PEAK_SECONDS", 0.05)
    hardware._cpu_peak.cache_clear()
    try:
        assert hardware.measured_cpu_peak("fp32") == pytest.approx(2 * 1024**3 / 0.001)
    finally:
        hardware._cpu_peak.cache_clear()


def test_a_cpu_peak_of_second_long_matmuls_times_one(monkeypatch):
    """bf16 emulated on a CPU without bf16 instructions: 1.7 s a 1024-size matmul on a 2-core EPYC, where six of
    them made a paper recipe's dry run 18 s. A matmul over CPU_PEAK_MAX_SECONDS is the figure. Stubbed clock: 2 s
    each (fp32's matmuls, which take milliseconds: the rule is the same for both dtypes)."""
    from angpt.train import hardware

    clock, syncs = [0.0], [0]

    def sync(device):
        syncs[0] += 1
        if syncs[0] % 2 == 0:
            clock[0] += 2.0

    monkeypatch.setattr(hardware, "_sync", sync)
    monkeypatch.setattr(hardware.time, "perf_counter", lambda: clock[0])
    hardware._cpu_peak.cache_clear()
    try:
        assert hardware.measured_cpu_peak("fp32") == pytest.approx(2 * 1024**3 / 2.0) and syncs[0] == 2
    finally:
        hardware._cpu_peak.cache_clear()


def test_a_gpu_peak_times_many_matmuls_per_synchronisation(monkeypatch):
    """On a GPU a synchronisation costs about what a matmul does, so `matmul_peak` times a batch of them between two
    (a single 2048-size matmul per timing read 404 TFLOP/s on an H200 that runs at 781). Stubbed clock: every
    timing costs 20 us of synchronisation and the matmuls nothing, so the figure grows with the batch."""
    from angpt.train import hardware

    clock, syncs = [0.0], [0]

    def sync(device):
        syncs[0] += 1
        if syncs[0] % 2 == 0:
            clock[0] += 20e-6

    monkeypatch.setattr(hardware, "_sync", sync)
    monkeypatch.setattr(hardware.time, "perf_counter", lambda: clock[0])
    cpu = torch.device("cpu")
    one = hardware.matmul_peak("fp32", cpu, n=64, reps=2, batch=1)
    ten = hardware.matmul_peak("fp32", cpu, n=64, reps=2, batch=10)
    assert one == pytest.approx(2 * 64**3 / 20e-6) and ten == pytest.approx(10 * one)
    assert hardware.peak_shape(torch.device("cuda")) == (8192, 10) and hardware.peak_shape(cpu) == (2048, 1)
    monkeypatch.setattr(hardware, "peak_shape", lambda device: (64, 10))  # what a GPU's defaults would do
    assert hardware.matmul_peak("fp32", cpu, reps=2) == pytest.approx(ten)


@pytest.mark.slow
def test_stability_sweep_keeps_earlier_arms_and_never_counts_a_run_made_under_other_defaults(data_dir, tmp_path):
    """benchmarks/stability_sweep.py: a second invocation with another arm keeps the first one's rows (and deletes a
    finished run's checkpoints unless told to keep them); a stored run
    whose arm now makes another model (here: written with anGPT's alpha at speed 1) stops a sweep in one line before
    anything trains, and `--report-only` names it beside its rows, keeping the command that trained them."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "stability_sweep.py"
    out = tmp_path / "sweep"

    def sweep(arm, *extra):
        args = [sys.executable, str(script), "--data", str(data_dir), "--out", str(out), "--arms", arm, "--lrs", "1e-3"]
        args += ["--preset", "tiny", "--steps", "3", "--batch", "2", "--seq", "32", "--eval-every", "3"]
        args += ["--eval-batches", "1", "--save-every", "3", "--jobs", "1", "--dtype", "fp32", *extra]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        return subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)

    for arm in ("gpt+", "angpt"):
        res = sweep(arm)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert [(r["arm"], r["status"], r["trained_with"]) for r in report["runs"]] == [
        ("angpt", "finished", None),
        ("gpt+", "finished", None),
    ]
    assert set(report["verdict"]) == {"angpt", "gpt+"}
    # provenance: the tokens the runs read (a re-prepared folder of the same name need not hold them) and the code
    from angpt.data import data_identity

    assert report["data"]["fingerprint"] == data_identity(data_dir)["data_fingerprint"]
    assert report["data"]["tokens"]["train"] > 0 and report["data"]["prepare"]["tokenizer"]
    (revision,) = {json.loads(p.read_text())["git_revision"] for p in out.glob("runs/*/*/provenance.json")}
    md = (out / "report.md").read_text()
    assert f"- data: fingerprint {report['data']['fingerprint'][:16]}" in md and "other data" not in md
    assert f"- runs made at revision {(revision or 'unknown')[:12]}" in md
    # a finished run's checkpoints are gone (the sweep reads metrics; at gpt2-small each is 1.5 GB)
    assert not list(out.glob("runs/*/*/checkpoints")) and (out / "runs" / "gpt+" / "lr0.001" / "metrics.jsonl").exists()

    config = out / "runs" / "angpt" / "lr0.001" / "config.json"
    stored = json.loads(config.read_text())
    stored["run"]["model"]["alpha_speed"] = 1.0  # the run's record (issue 54)
    config.write_text(json.dumps(stored))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for lrs in ("1e-3", "2e-3"):  # the stored rate, and a new one beside it: neither trains
        res = sweep("angpt", "--lrs", lrs)
        assert res.returncode == 2 and res.stderr.count("\n") == 1
        assert "runs/angpt/lr0.001 was trained with model.alpha_speed=1.0 (now 5.0)" in res.stderr
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before

    # a run that recorded other tokens than the folder holds now (re-prepared since) is named as such
    gpt_prov = out / "runs" / "gpt+" / "lr0.001" / "provenance.json"
    assert json.loads(gpt_prov.read_text())["data_fingerprint"] == report["data"]["fingerprint"]
    gpt_prov.write_text(json.dumps({**json.loads(gpt_prov.read_text()), "data_fingerprint": "0" * 64}))
    res = sweep("angpt", "--report-only")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "**trained on other data** (the folder was re-prepared since): gpt+ @ 0.001\n" in res.stdout
    report = json.loads((out / "report.json").read_text())
    assert [r["trained_with"] for r in report["runs"]] == ["model.alpha_speed=1.0 (now 5.0)", None]
    assert "--report-only" not in report["command"] and "--report-only" in report["rewritten_by"]
    assert (
        "Trained with model.alpha_speed=1.0 (now 5.0), a model these arms no longer make: angpt @ 0.001"
        in (out / "report.md").read_text()
    )
    res = sweep("gpt+", "--lrs", "2e-3", "--keep-checkpoints")  # kept when asked: the last one and the best
    assert res.returncode == 0, res.stderr[-2000:]
    kept = sorted(p.name for p in (out / "runs" / "gpt+" / "lr0.002" / "checkpoints").iterdir())
    assert kept == ["best", "step_000003"], kept

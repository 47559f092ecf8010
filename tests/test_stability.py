"""anGPT trains where users train it (issue 22): its first steps at GPT-2 small width and depth, the stability
criteria the sweeps apply, and the trainer's early warning of a residual stream that grows layer over layer.

The reproduction needs no data: i.i.d. tokens from a Zipf distribution over GPT-2's 50,304 ids carry the one signal
that triggers the blow-up (learn the unigram distribution, coherently, from step 1); uniform tokens do not."""

import json
import math

import pytest
import torch

from angpt.bench.firststeps import first_steps, stability, zipf_batches
from angpt.models import angpt as angpt_module
from angpt.train.config import load_run_config
from angpt.train.loop import train
from angpt.train.watch import ResidualWatch

pytestmark = pytest.mark.usefixtures("one_thread")

# anGPT's defaults before 2026-11-25: nGPT's s_z = 1 and alpha = 0.05, no normalisation of the MLP input
OLD_DEFAULTS = "angpt[s_z_init=1.0,alpha_init=0.05,alpha_speed=1.0,input_norm=none]"
VOCAB, T, B = 50304, 64, 4


def gpt2_small_on_zipf(arm: str, lr: float, steps: int = 3):
    probe = zipf_batches(VOCAB, 2, T, seed=99)()[0]
    return first_steps(
        arm,
        "gpt2-small",
        lr,
        steps,
        zipf_batches(VOCAB, B, T, seed=0),
        probe,
        batch_tokens=B * T,
        context_length=T,
        dtype="fp32",
        max_steps=1000,
    )  # fmt: skip  (max_steps: the LR of a long run's first steps, not of a 3-step cosine)


def max_residual(run) -> float:
    norms = [max(r["residual_norms"]) if r.get("residual_norms") else math.inf for r in run.records]
    return max(norms)


@pytest.mark.slow
def test_old_defaults_blow_up_in_three_steps_at_gpt2_small():
    """What users hit first: at 1e-3 (a quarter of the recipe's rate) the residual norm of the last layers passes
    20 after the third update (measured max ||h||: 1.04, 1.24, inf), and the next loss is in the thousands."""
    run = gpt2_small_on_zipf(OLD_DEFAULTS, 1e-3)
    assert max_residual(run) > 20, [r.get("residual_norms") for r in run.records]


@pytest.mark.slow
def test_defaults_keep_the_residual_stream_near_one_at_gpt2_small():
    """The same three steps at twice the rate: ||h|| stays within 20% of 1 at every layer and the loss falls
    (measured: max ||h|| 1.004, 1.027, 1.082)."""
    run = gpt2_small_on_zipf("angpt", 2e-3)
    assert run.status == "finished"
    assert max_residual(run) < 1.2, [r.get("residual_norms") for r in run.records]
    assert run.records[-1]["loss"] < run.records[0]["loss"]


def records(losses, grads):
    return [{"step": i + 1, "loss": loss, "grad_norm": g} for i, (loss, g) in enumerate(zip(losses, grads))]


def test_stability_criteria():
    smooth = records([9, 8, 7.5, 7, 6.8, 6.5, 6.4, 6.3], [1] * 8)
    assert stability(smooth)["stable"] and stability(smooth)["first_spike"] is None
    assert stability(smooth)["loss_ratio"] <= 1.0 and stability(smooth)["grad_ratio"] == 1.0
    # a rise to 1.35x the running minimum after step 5 is a spike; the same rise at step 3 is not counted
    late = records([9, 8, 7, 6.5, 6.4, 6.3, 8.5, 6.2], [1] * 8)
    assert stability(late)["first_spike"] == 7 and not stability(late)["stable"]
    early = records([9, 8, 10.8, 7, 6.9, 6.8, 6.7, 6.6], [1] * 8)
    assert stability(early)["stable"] and stability(early)["loss_ratio"] < 1.3
    # a gradient norm above 100x the run's median, at any step
    grad = records([9, 8, 7, 6.9, 6.8, 6.7, 6.6, 6.5], [1, 1, 150, 1, 1, 1, 1, 1])
    assert stability(grad)["first_spike"] == 3 and stability(grad)["grad_ratio"] == 150
    # a non-finite loss is a spike
    nan = records([9, 8, 7, 6.9, 6.8, 6.7, math.nan], [1] * 7)
    assert not stability(nan)["stable"] and stability(nan)["first_spike"] == 7


def test_first_steps_stop_a_diverging_run_at_once():
    probe = torch.randint(0, 256, (1, 32))
    run = first_steps(
        "angpt[input_norm=none]", "tiny", 50.0, 20, zipf_batches(256, 4, 32), probe, batch_tokens=128, stop_factor=1.2
    )
    assert run.status == "diverged" and len(run.records) < 20
    ok = first_steps("gpt+", "tiny", 1e-3, 5, zipf_batches(256, 4, 32), probe, batch_tokens=128)
    assert ok.status == "finished" and len(ok.records) == 5
    assert all(len(r["residual_norms"]) == 2 for r in ok.records)  # the tiny preset's two layers


def test_first_steps_run_the_architectures_hook_as_the_trainer_does():
    """`nu_att: calibrated` measures before its step in the first-steps runs too (the kit screens it): at step 0 on
    the side batches, recorded in the first step's note; its first gradient differs from `dense`'s (which measures
    nothing)."""
    probe = torch.randint(0, 256, (1, 32))
    side = zipf_batches(256, 4, 32, seed=7)
    common = dict(preset="tiny", lr=1e-3, steps=2, probe=probe, batch_tokens=128, context_length=32)
    arm = "angpt[nu_att=calibrated,nu_att_calibrate_at=0]"
    run = first_steps(arm, next_batch=zipf_batches(256, 4, 32), side_batches=lambda n: [side()[0] for _ in range(n)],
                      **common)  # fmt: skip
    dense = first_steps("angpt[nu_att=dense]", next_batch=zipf_batches(256, 4, 32), **common)
    assert run.records[0]["note"].startswith("nu_att calibrated at step 0") and "note" not in run.records[1]
    assert run.records[0]["grad_norm"] != dense.records[0]["grad_norm"]  # 0.19518 and 0.19536
    with pytest.raises(ValueError, match="side_batches"):
        first_steps(arm, next_batch=zipf_batches(256, 4, 32), **common)


def test_a_compiled_first_steps_run_trains_through_the_compiled_forward(monkeypatch):
    """The GPU screen runs compiled (`screen.compile`, ~2x the eager step there): the training step calls what
    torch.compile returned, and the losses match the eager run's. torch.compile stubbed by a wrapper that counts
    its calls (a real compile costs seconds on a CPU)."""
    import angpt.bench.firststeps as fs

    calls = []

    class Counted(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, *a, **k):
            calls.append(1)
            return self.net(*a, **k)

    monkeypatch.setattr(fs.torch, "compile", lambda f, **kw: Counted(f) if isinstance(f, torch.nn.Module) else f)
    probe = torch.randint(0, 256, (1, 32))
    common = dict(preset="tiny", lr=1e-3, steps=2, probe=probe, batch_tokens=128, context_length=32)
    eager = first_steps("angpt", next_batch=zipf_batches(256, 4, 32), **common)
    assert calls == []
    compiled = first_steps("angpt", next_batch=zipf_batches(256, 4, 32), compile=True, **common)
    assert len(calls) == 2 and [r["loss"] for r in compiled.records] == [r["loss"] for r in eager.records]


def test_a_compiled_first_steps_run_counts_the_graphs_each_step_compiles(monkeypatch):
    """Each compiled step's record says how many graphs Dynamo compiled during it: the first step compiles the
    forward (and the constraint), later ones nothing, though the run measures every layer's norms between steps
    (a leftover `recorder` attribute once made step 2 compile the model again). Real Dynamo, with the aot_eager
    backend (no code generation); an eager run's records carry no count."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda f, **kw: real(f, **{**kw, "backend": "aot_eager"}))
    probe = torch.randint(0, 256, (1, 32))
    common = dict(preset="tiny", lr=1e-3, steps=3, probe=probe, batch_tokens=128, context_length=32)
    run = first_steps("angpt", next_batch=zipf_batches(256, 4, 32), compile=True, **common)
    graphs = [r["graphs"] for r in run.records]
    assert graphs[0] >= 1 and graphs[1:] == [0, 0], graphs
    eager = first_steps("gpt+", next_batch=zipf_batches(256, 4, 32), **{**common, "steps": 1})
    assert "graphs" not in eager.records[0]


def test_each_first_step_records_the_largest_logit_on_the_probe():
    """A loss that blows up while the residual norms stay near 1 (the CPU stand-in's combination, 2026-11-27: loss
    7e5 at step 6, norms at most 1.33) needs another reading: each record carries the largest |logit| on the probe.
    At rate 1e-12 the weights stay as built (to rounding), so it equals that of a model built alike,
    computed here without first_steps."""
    import angpt

    probe = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(5))
    run = first_steps("angpt", "tiny", 1e-12, 1, zipf_batches(256, 4, 32), probe, batch_tokens=128, context_length=32)
    torch.manual_seed(0)
    fresh = angpt.build_model("angpt", "tiny", context_length=32).eval()
    with torch.no_grad():
        want = fresh(probe)[0].abs().max().item()
    assert run.records[0]["max_logit"] == pytest.approx(want, rel=1e-4)


def tiny_run(data_dir, out, **model):
    overrides = [
        ("arch", "angpt"),
        ("data", str(data_dir)),
        ("out", str(out)),
        ("preset", "tiny"),
        ("train.batch_tokens", 256),
        ("train.micro_batch", 4),
        ("train.max_steps", 6),
        ("train.log_every", 3),
        ("train.eval_every", 0),
        ("train.dtype", "fp32"),
        ("train.progress", False),
        ("train.tensorboard", False),
        *((f"model.{k}", v) for k, v in model.items()),
    ]
    return train(load_run_config(None, overrides))


@pytest.mark.parametrize("paper_form", [True, False])
def test_trainer_warns_once_when_the_residual_stream_grows_layer_over_layer(
    data_dir, tmp_path, monkeypatch, capsys, paper_form
):
    """A block whose output grows 5x per layer from the third step on (what a blow-up's onset looks like): the run
    warns at step 3, naming the layer, the growth per layer and the rate to lower, once, and logs it. In the paper's
    form (no input norm, the dense attention factor) it names our defaults too; with them, only the rate."""
    original = angpt_module.ANGPTBlock.forward
    grow = {"on": False}

    def growing(self, h, ctx):
        out = original(self, h, ctx)
        return out * 5.0 if grow["on"] else out

    monkeypatch.setattr(angpt_module.ANGPTBlock, "forward", growing)
    from angpt.train import watch

    check = watch.ResidualWatch.check

    def check_after_two(self, model, step):
        grow["on"] = step >= 3
        try:
            return check(self, model, step)
        finally:
            grow["on"] = False

    monkeypatch.setattr(watch.ResidualWatch, "check", check_after_two)
    tiny_run(data_dir, tmp_path / "r", **(dict(input_norm="none", nu_att="dense") if paper_form else {}))
    err = capsys.readouterr().err
    assert err.count("warning: step 3: the residual stream grows layer over layer") == 1, err
    assert "at layer 1 (x5" in err
    assert ("model.input_norm=mlp" in err) == paper_form and ("model.nu_att=none" in err) == paper_form, err
    assert "halve the learning rate (train.lr=0.002; this run's is 0.004)" in err  # a rate to try, not the one run
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "warning" in r] == [3]
    # the measurement the warning judged is in its row: the last layer's ||h|| is the one it names
    (warned,) = [r for r in rows if "warning" in r]
    assert f"to {warned['residual_norms'][-1]:.3g} at layer 1" in warned["warning"], warned


def watched(jump=ResidualWatch.JUMP, window=ResidualWatch.WINDOW):
    watch = ResidualWatch(4.0, None, "fp32", "lower the rate", jump=jump, window=window)
    watch.recent.append(1.0)  # the norm before the first step
    return watch


def test_slow_growth_past_the_bound_is_no_onset_but_a_sudden_rise_is():
    """A small model that learns grows its last layer's ||h|| past 4 over tens of steps (d = 48, 3 layers:
    benchmarks/watch-calibration-cpu): no warning. The same value reached within a few measurements warns, once,
    naming the layer and the growth per layer; so does a NaN (read as inf)."""
    slow = [[1.0, 1.0 + 0.1 * s, 1.0 + 0.2 * s] for s in range(1, 31)]  # 1.2 ... 7.0 at the last layer
    watch = watched()
    assert [watch.observe(s, norms) for s, norms in enumerate(slow, 1)] == [None] * 30
    assert not watch.warned

    watch = watched()
    assert watch.observe(1, [1.0, 1.1, 1.2]) is None
    message = watch.observe(2, [1.0, 3.0, 9.0])
    assert message.startswith("step 2: the residual stream grows layer over layer, ||h|| 1.00 at layer 0 to 9 at")
    assert "at layer 2 (x3.00 per layer;" in message and message.endswith("lower the rate")
    assert watch.observe(3, [1.0, 30.0, 90.0]) is None  # once

    assert watched().observe(1, [1.0, math.inf]).startswith("step 1:")
    # a rise that stays under the bound is none either
    assert watched().observe(1, [1.0, 1.5, 3.9]) is None


def test_the_rise_is_judged_against_the_previous_measurement():
    """The largest norm must be JUMP x the previous measurement (the least of the last `window` ones): a healthy
    small model's 1.9x a step past the bound is no onset (depth 12, d = 32, lr 8e-3: 1.8, 2.94, 5.49, 8.1, ...), a
    2x rise is. With no jump set, the bound alone decides (the watch before 2026-11-26)."""
    watch = watched()
    for s, top in enumerate([1.03, 1.12, 1.32, 1.8, 2.94, 5.49, 8.1, 9.26, 8.9, 7.64], 1):
        assert watch.observe(s, [1.0, top]) is None, s
    assert watch.observe(11, [1.0, 15.3]) is not None  # 2x the 7.64 before it

    longer = watched(window=3)  # the same growth against the least of the last three warns at once
    for s, top in enumerate([1.8, 2.94], 1):
        assert longer.observe(s, [1.0, top]) is None, s
    assert longer.observe(3, [1.0, 5.49]) is not None  # 2x the 1.0 of step 0

    assert watched(jump=None).observe(1, [1.0, 4.1]) is not None


def test_the_trainer_judges_the_first_steps_against_the_norms_before_them(data_dir, tmp_path, monkeypatch, capsys):
    """A model whose stream is large from initialisation on (every block's output 6x: ||h|| ~6 at the last layer
    before any step) has no onset to warn of: the trainer measures before step 1, and nothing rises after."""
    original = angpt_module.ANGPTBlock.forward
    monkeypatch.setattr(angpt_module.ANGPTBlock, "forward", lambda self, h, ctx: original(self, h, ctx) * 6.0)
    tiny_run(data_dir, tmp_path / "r")
    assert "residual stream" not in capsys.readouterr().err


def test_the_watch_is_not_counted_in_the_step_time(data_dir, tmp_path, monkeypatch):
    """The probe forward after each of the first 50 steps is the watch's cost, not the step's: step_time (and the
    throughput and MFU computed from it) leaves it out."""
    import time

    from angpt.train import watch

    check = watch.ResidualWatch.check
    monkeypatch.setattr(watch.ResidualWatch, "check", lambda self, m, s: (time.sleep(0.5), check(self, m, s))[1])
    tiny_run(data_dir, tmp_path / "r")
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time"] for r in rows if "step_time" in r]
    assert times and max(times) < 0.5, times


def test_a_healthy_run_does_not_warn_and_logs_what_the_watch_measured(data_dir, tmp_path, capsys):
    """No warning; each logged row of the first 50 steps holds every layer's ||h|| on the probe, and the first row
    the measurement before step 1 too: the data a later calibration of the warning replays (watch_calibration.py
    had to rebuild models for it; with train.log_every 1, as the sweeps log, every step's)."""
    tiny_run(data_dir, tmp_path / "r")
    assert "residual stream" not in capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step_time" in r]
    assert len(steps) == 3 and [len(r["residual_norms"]) for r in steps] == [2] * 3  # the tiny preset's 2 layers
    assert len(steps[0]["residual_norms_start"]) == 2 and all("residual_norms_start" not in r for r in steps[1:])
    assert steps[0]["residual_norms_start"] != steps[0]["residual_norms"]  # before and after the first update


def test_smoothed_criteria_ignore_one_hard_batch_but_not_a_real_spike():
    """At small batches one batch's content moves its loss 20-40% (every arm at the same step): over a 10-step
    mean that is no spike; a loss that stays 1.5x up for ten steps is one either way."""
    flat = [5.0] * 30
    hard_batch = flat[:20] + [7.0] + flat[21:]
    sustained = flat[:15] + [7.5] * 15
    grads = [1.0] * 30
    assert not stability(records(hard_batch, grads))["stable"]
    assert stability(records(hard_batch, grads), smooth=10)["stable"]
    assert not stability(records(sustained, grads), smooth=10)["stable"]


def test_a_checkpoint_written_before_alpha_speed_keeps_its_alphas():
    """anGPT's alpha_speed 5 came after checkpoints with alpha at nGPT's speed 1. Their model config has no
    alpha_speed: it must load at speed 1, so their stored alphas mean what they meant (at 5 the effective alphas
    would be 5x), and resuming one under today's defaults is refused, naming the field."""
    from angpt.checkpoint import RunState
    from angpt.errors import UserError
    from angpt.models import ModelConfig, build_model, model_from_config
    from angpt.train.config import load_run_config
    from angpt.train.record import read_state_record
    from angpt.train.resume import check_resume
    from angpt.train.setup import resolve

    torch.manual_seed(0)
    trained = build_model("angpt", "tiny", alpha_speed=1.0)
    with torch.no_grad():
        for block in trained.blocks:  # a trained checkpoint: alphas away from their init
            block.alpha_A.param.mul_(1.7)
    written = {k: v for k, v in trained.config.to_dict().items() if k != "alpha_speed"}
    loaded = model_from_config(ModelConfig.from_dict(written))
    loaded.load_state_dict(trained.state_dict())
    assert torch.equal(loaded.blocks[0].alpha_A(), trained.blocks[0].alpha_A())
    settings = {"arch": "angpt", "preset": "tiny"}
    recorded = read_state_record({"run_config": settings, "model_config": written})  # a checkpoint of its day
    today = resolve(load_run_config(None, settings), device=torch.device("cpu"))
    with pytest.raises(UserError, match="alpha_speed"):
        check_resume("ckpt", recorded, today, RunState(step=0, model_config=written))


def test_angpt_alpha_starts_at_the_papers_001_and_steps_as_far_as_ngpts_alpha():
    """anGPT's default alpha (docs/open_choices.md#alphas-speed): it starts at 0.01, and Adam's first step moves it
    as far as nGPT's alpha started at 0.05 (a near-sign step: lr * 0.05 * sqrt(d) per coordinate)."""
    from angpt import build_model, make_optimizer
    from angpt.bench.firststeps import zipf_batches

    steps = {}
    for arch, init in (("angpt", 0.01), ("ngpt", 0.05)):
        torch.manual_seed(0)
        model = build_model(arch, "tiny")
        alpha = model.blocks[0].alpha_A
        assert torch.allclose(alpha(), torch.full_like(alpha(), init))
        opt, _ = make_optimizer(model, lr=1e-3, max_steps=10, constraints=False)
        x = zipf_batches(model.config.vocab_size, 4, 33, seed=0)()[0]
        model(x[:, :-1], x[:, 1:])[1].backward()
        before = alpha().detach().clone()
        opt.step()
        steps[arch] = (alpha().detach() - before).abs().median().item()
    assert steps["angpt"] == pytest.approx(steps["ngpt"], rel=0.02)
    assert steps["ngpt"] == pytest.approx(1e-3 * 0.05 * math.sqrt(64), rel=0.02)

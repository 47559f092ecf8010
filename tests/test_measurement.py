"""What every result stands on (issue 26): each test here fails under a realistic silent bug that the rest of
the suite let through, and checks its property against a reference computed independently of the code under test.

* the reported validation loss is the token-weighted mean cross-entropy over the evaluation windows;
* resuming onto other token data (same tokenizer) is refused;
* the data loader resumes exactly from a cursor saved after an epoch boundary;
* `TrainStep.update()` clips before it steps and returns the pre-clip gradient norm;
* the BPE tokenizer is fitted on the train split drawn with the dataset's own seed.
"""

import copy
import hashlib
import json
import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import angpt
from angpt import checkpoint as ckpt
from angpt.data import TokenLoader, load_meta, open_shard, prepare_dataset
from angpt.train.step import TrainStep

from .test_train import TINY, metrics, run_cli

SEQ = 64  # the tiny preset's context length: the trainer's default seq_len


def _option(args: list, name: str, value) -> list:
    """`args` (a copy of TINY) with `--name` set to `value`."""
    args = list(args)
    args[args.index(name) + 1] = str(value)
    return args


def _split_windows(data_dir, split: str, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All windows of a split, read straight from its shard files: window i of a shard is tokens
    [i*seq_len, (i+1)*seq_len + 1) of that shard, never crossing into the next one."""
    meta = load_meta(data_dir)
    xs, ys = [], []
    for shard in meta["splits"][split]["shards"]:
        tokens = np.asarray(open_shard(data_dir / shard["file"])).astype(np.int64)
        for i in range((len(tokens) - 1) // seq_len):
            window = torch.from_numpy(tokens[i * seq_len : (i + 1) * seq_len + 1].copy())
            xs.append(window[:-1])
            ys.append(window[1:])
    return torch.stack(xs), torch.stack(ys)


def _mixed_docs(n: int, seed: int) -> list[str]:
    """Documents of very different predictability (repeated words vs random letters), so that windows' losses
    differ and any wrong weighting of them shows."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        if i % 2:
            body = " ".join(rng.choice(["alpha", "beta", "gamma"]) for _ in range(rng.randrange(20, 40)))
        else:
            body = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 ") for _ in range(rng.randrange(100, 250)))
        docs.append(f"{i}: {body}\n")
    return docs


def _prepare(tmp_path, name: str, docs: list[str], **kw):
    folder = tmp_path / f"docs_{name}"
    folder.mkdir()
    for i, text in enumerate(docs):
        (folder / f"d{i:03d}.txt").write_text(text)
    out = tmp_path / f"data_{name}"
    prepare_dataset(folder, "bytes", out, progress=False, **kw)
    return out


# ----------------------------------------------------------------------------------------- validation loss
def test_logged_val_loss_is_the_token_weighted_mean_cross_entropy(tmp_path):
    """The val_loss in metrics.jsonl equals a plain cross-entropy summed over every target token of the evaluation
    windows (the whole val split, in order) divided by their number, recomputed from the saved weights.

    The val split is cut so that its last evaluation batch is smaller than micro_batch: a loss divided by the
    micro-batch size, or a mean of batch means, both differ from the token-weighted mean here.
    """
    data = _prepare(tmp_path, "mixed", _mixed_docs(40, seed=1), val_fraction=0.25)
    x, y = _split_windows(data, "val", SEQ)
    micro = 4
    assert len(x) % micro, f"{len(x)} val windows: the last evaluation batch must be a partial one"
    out = tmp_path / "run"
    args = _option(TINY, "--train.micro_batch", micro)
    rc = run_cli("--arch", "gpt+", "--data", data, *args, "--out", out, "--train.max_steps", "3")
    assert rc == 0
    (row,) = [r for r in metrics(out) if "val_loss" in r]
    assert row["step"] == 3

    model, _ = ckpt.load_checkpoint_model(out / "checkpoints" / "step_000003")
    with torch.no_grad():
        logits = model(x)[0].float()
        token_ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
    expected = (token_ce.sum() / token_ce.numel()).item()
    assert row["val_loss"] == pytest.approx(expected, rel=1e-5)

    # The setting tells the weightings apart: the wrong ones are far outside the tolerance.
    per_window = token_ce.mean(dim=1)
    batch_means = torch.stack([b.mean() for b in per_window.split(micro)])
    for wrong in (batch_means.mean().item(), expected / micro):
        assert abs(wrong - expected) > 100 * 1e-5 * expected, (wrong, expected)


# ---------------------------------------------------------------------------------------------- resume data
def test_resume_refuses_other_token_data_with_the_same_tokenizer(tmp_path, capsys):
    """Same tokenizer ("bytes"), same split sizes even, other documents: the run's tokens would change under it."""
    words = ["red green blue cyan", "north south east west"]
    docs = [[f"{k} " + " ".join(w.split()[(k + j) % 4] for j in range(120)) + "\n" for k in range(24)] for w in words]
    first, second = (_prepare(tmp_path, name, d, val_fraction=0.2) for name, d in zip("ab", docs))
    assert load_meta(first)["tokenizer_hash"] == load_meta(second)["tokenizer_hash"]
    out = tmp_path / "run"
    common = ["--arch", "angpt", *TINY, "--out", out, "--train.max_steps", "4", "--train.save_every", "0"]
    assert run_cli(*common, "--data", first, "--train.stop_at", "2") == 0
    capsys.readouterr()
    rc = run_cli(*common, "--data", second, "--resume", "auto")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "token data differs" in err[0] and str(second) in err[0], err
    assert [r["step"] for r in metrics(out)] == [1, 2]  # nothing was trained on the other data


# ------------------------------------------------------------------------------------------- loader resume
def test_loader_resumes_exactly_from_a_cursor_saved_after_an_epoch_boundary(data_dir):
    """A cursor saved in epoch 1 (JSON round trip, as in state.json) continues with the very batches the original
    loader reads next, on into epoch 2: epochs have different orders, so losing the epoch would replay epoch 0's."""
    batch, seq = 16, 256
    loader = TokenLoader(data_dir, "train", batch, seq, seed=3)
    per_epoch = loader.num_windows // batch
    for _ in range(per_epoch + 3):
        loader.next_batch()
    assert loader.epoch == 1
    state = json.loads(json.dumps(loader.state_dict()))
    expected = [loader.next_batch() for _ in range(per_epoch)]
    assert loader.epoch == 2  # the continuation crosses the next boundary too

    resumed = TokenLoader(data_dir, "train", batch, seq, seed=3)
    resumed.load_state_dict(state)
    assert resumed.epoch == 1
    got = [resumed.next_batch() for _ in range(per_epoch)]
    for (x, y), (rx, ry) in zip(expected, got):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    assert resumed.epoch == loader.epoch == 2

    # Independently: epoch e reads windows in the order of the permutation drawn from (seed, e); the first
    # batch after the cursor is the stream position (per_epoch + 3) * batch.
    x_all, _ = _split_windows(data_dir, "train", seq)
    n = len(x_all)
    start = (per_epoch + 3) * batch
    epoch, pos = divmod(start, n)
    ids = np.concatenate([np.random.default_rng([3, e]).permutation(n) for e in (epoch, epoch + 1)])
    assert torch.equal(got[0][0], x_all[torch.from_numpy(ids[pos : pos + batch])])


# ---------------------------------------------------------------------------------------------- clip order
def test_update_clips_the_gradients_before_the_step_and_returns_the_pre_clip_norm(one_thread):
    """`TrainStep.update()` (bench's and compare's step) must step with gradients clipped to grad_clip: the change
    of the weights equals SGD on manually rescaled gradients, and its return value is the true pre-clip norm."""
    torch.manual_seed(0)
    model = angpt.build_model("gpt+", "tiny", vocab_size=256)
    reference = copy.deepcopy(model)
    x = torch.randint(0, 256, (4, 32))
    y = torch.randint(0, 256, (4, 32))
    max_norm, lr = 0.05, 0.5

    # Reference: plain gradients, their norm, a manual rescale to max_norm, a plain SGD update by hand.
    _, loss = reference(x, y)
    loss.backward()
    grads = [p.grad.detach().clone() for p in reference.parameters()]
    true_norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    assert true_norm > 10 * max_norm, "clipping must be active for this test to mean anything"
    scale = max_norm / (true_norm + 1e-6)
    expected = [p.detach() - lr * scale * g for p, g in zip(reference.parameters(), grads)]

    opt = torch.optim.SGD(model.parameters(), lr=lr)
    step = TrainStep(model, opt, None, device=torch.device("cpu"), dtype="fp32", grad_clip=max_norm)
    step.accumulate(lambda: (x, y))
    norm = step.update()
    assert float(norm) == pytest.approx(true_norm, rel=1e-5)
    for (name, p), want in zip(model.named_parameters(), expected):
        torch.testing.assert_close(p.detach(), want, rtol=1e-5, atol=1e-7, msg=name)
    assert all(p.grad is None for p in model.parameters())  # and the gradients are cleared for the next step


def test_update_with_clipping_off_steps_with_the_raw_gradients(one_thread):
    torch.manual_seed(0)
    model = angpt.build_model("gpt+", "tiny", vocab_size=256)
    reference = copy.deepcopy(model)
    x, y = torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))
    reference(x, y)[1].backward()
    grads = [p.grad.detach().clone() for p in reference.parameters()]
    true_norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    step = TrainStep(
        model, torch.optim.SGD(model.parameters(), lr=0.1), None, device=torch.device("cpu"), dtype="fp32", grad_clip=0
    )
    step.accumulate(lambda: (x, y))
    assert float(step.update()) == pytest.approx(true_norm, rel=1e-5)
    for p, q, g in zip(model.parameters(), reference.parameters(), grads):
        torch.testing.assert_close(p.detach(), q.detach() - 0.1 * g, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------------ BPE train texts
def _in_val(text: str, seed: int, val_fraction: float) -> bool:
    """The documented split rule, written out here: blake2b (8 bytes, keyed by the seed's decimal string) of the
    UTF-8 text, read little-endian as a fraction of 2**64, below val_fraction -> validation."""
    digest = hashlib.blake2b(text.encode(), digest_size=8, key=str(seed).encode()).digest()
    return int.from_bytes(digest, "little") / 2.0**64 < val_fraction


def test_bpe_is_fitted_on_the_train_split_of_the_datasets_own_seed(tmp_path, monkeypatch):
    """At seed 7 the texts handed to the BPE trainer are exactly the train documents (in source order), none of the
    validation ones; seed 0 would draw another split, so using the wrong seed there shows."""
    from angpt.data import prepare as prepare_mod

    docs = [f"doc {i}: " + " ".join(f"w{(i * 13 + j) % 97}" for j in range(30)) + "\n" for i in range(60)]
    vf, seed = 0.3, 7
    # held out: validation [0, vf) and test [vf, 2 vf) of the hash (test as large as validation by default)
    train = [d for d in docs if not _in_val(d, seed, 2 * vf)]
    val = [d for d in docs if _in_val(d, seed, vf)]
    assert val and train
    assert train != [d for d in docs if not _in_val(d, 0, 2 * vf)], "seed 0 must draw another split here"

    fitted: list[str] = []
    original = prepare_mod.train_bpe

    def recording(batches, *args, **kwargs):
        batches = [list(b) for b in batches]
        fitted.extend(d for b in batches for d in b)
        return original(iter(batches), *args, **kwargs)

    monkeypatch.setattr(prepare_mod, "train_bpe", recording)
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    meta = prepare_dataset(src, "bpe:300", tmp_path / "out", val_fraction=vf, seed=seed, progress=False)
    assert fitted == train
    assert not set(fitted) & set(val)
    assert meta["splits"]["val"]["documents"] == len(val)  # and the shards were split by the same rule
    assert meta["splits"]["test"]["documents"] == len(docs) - len(train) - len(val)


# ------------------------------------------------------------------ round two: what a per-file audit found open
def test_cosine_with_warmup_peaks_after_the_warmup_and_ends_at_the_floor():
    """The schedule written out by hand: linear to the peak over the warm-up, then cosine from the peak to
    min_lr_ratio exactly at max_steps (a span that forgets the warm-up ends above the floor)."""
    from angpt.train.optim import Schedule

    s = Schedule(max_steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert [s(i) for i in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert s(10) == pytest.approx(1.0)
    assert s(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # halfway through the decay
    assert s(110) == pytest.approx(0.1)


def test_bits_per_byte_is_nats_over_ln2_over_bytes_per_token():
    from angpt.train.metrics import bits_per_byte

    assert bits_per_byte(3 * math.log(2), 1.5) == pytest.approx(2.0)
    assert bits_per_byte(1.0, None) is None


def test_documented_optimizer_defaults():
    """The defaults every recipe inherits (docs/architectures.md#optimizer-recipes; the paper's clip 1.0 and
    nanoGPT's betas 0.9 / 0.95, floor 10% of the peak)."""
    from angpt.train.config import TrainConfig

    tc = TrainConfig()
    assert (tc.beta1, tc.beta2, tc.grad_clip, tc.min_lr_ratio, tc.schedule) == (0.9, 0.95, 1.0, 0.1, "cosine")
    assert (tc.lr, tc.weight_decay, tc.warmup_steps) == (None, None, None)  # the architecture's recipe decides


def test_resume_refuses_a_change_to_every_fixed_setting(data_dir, tmp_path, capsys):
    """Every train.* field that shapes the optimisation or the tokens seen (resume.FIXED_TRAIN) is refused on
    resume with a one-line error naming it."""
    from angpt.train.resume import FIXED_TRAIN

    from .test_train import run_cli

    changed = {
        "lr": 0.01,
        "weight_decay": 0.3,
        "warmup_steps": 2,
        "min_lr_ratio": 0.2,
        "schedule": "wsd",
        "decay_fraction": 0.5,
        "decay_shape": "linear",
        "beta1": 0.8,
        "beta2": 0.99,
        "grad_clip": 0.5,
        "batch_tokens": 1024,
        "micro_batch": 2,
        "seq_len": 32,
        "seed": 3,
        "dtype": "bf16",  # this run computed in fp32 (forced below)
    }
    assert set(changed) == set(FIXED_TRAIN)  # a new fixed field needs a value here
    out = tmp_path / "run"
    common = ["--arch", "gpt+", "--data", data_dir, *TINY, "--out", out, "--train.save_every", "0"]
    assert run_cli(*common, "--train.max_steps", "4", "--train.stop_at", "2", "--train.dtype", "fp32") == 0
    capsys.readouterr()
    for field, value in changed.items():
        rc = run_cli(*common, "--train.max_steps", "4", "--resume", "auto", f"--train.{field}", str(value))
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and f"train.{field}" in err[0], (field, err)


def _initial_weights(data_dir, out, seed):
    from .test_train import run_cli

    args = ["--arch", "gpt+", "--data", data_dir, *TINY, "--out", out, "--train.max_steps", "1"]
    assert run_cli(*args, "--train.seed", str(seed), "--train.lr", "1e-12") == 0  # one step that moves nothing
    last = sorted((out / "checkpoints").glob("step_*"))[-1]
    from safetensors.torch import load_file

    return load_file(str(last / "model.safetensors"))


def test_train_seed_seeds_the_initial_weights(data_dir, tmp_path):
    a, b = _initial_weights(data_dir, tmp_path / "a", 0), _initial_weights(data_dir, tmp_path / "b", 0)
    c = _initial_weights(data_dir, tmp_path / "c", 1)
    name = "blocks.0.qkv.weight"
    assert torch.equal(a[name], b[name]) and not torch.allclose(a[name], c[name])


def test_resume_auto_continues_from_the_newest_checkpoint(data_dir, tmp_path, capsys):
    from .test_train import run_cli

    out = tmp_path / "run"
    common = ["--arch", "gpt+", "--data", data_dir, *TINY, "--out", out, "--train.max_steps", "8"]
    assert run_cli(*common, "--train.save_every", "2", "--train.keep_last", "3", "--train.stop_at", "6") == 0
    assert [p.name for p in sorted((out / "checkpoints").glob("step_*"))] == [f"step_00000{i}" for i in (2, 4, 6)]
    capsys.readouterr()
    assert run_cli(*common, "--train.save_every", "2", "--train.keep_last", "3", "--resume", "auto") == 0
    assert "resuming from step 6" in capsys.readouterr().err


def test_accumulated_micro_batches_give_the_gradient_of_the_whole_batch(one_thread):
    """accum micro-batches of equal size: the summed (loss / accum) gradients equal the gradient of the mean loss
    over the concatenated batch, computed in one forward (a missing 1/accum doubles every update)."""
    torch.manual_seed(0)
    model = angpt.build_model("gpt+", "tiny")
    ref = copy.deepcopy(model)
    x = torch.randint(0, 256, (8, 33))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    halves = iter([(x[:4, :-1], x[:4, 1:]), (x[4:, :-1], x[4:, 1:])])
    TrainStep(model, opt, None, device=torch.device("cpu"), dtype="fp32", accum=2).accumulate(lambda: next(halves))
    logits, _ = ref(x[:, :-1])
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_grow_seed_decides_the_new_values(data_dir, tmp_path):
    """`angpt grow --seed` draws the new value tokens: the same seed twice gives the same checkpoint, another
    seed other values (state.json records the seed, so it must be the one used)."""
    from safetensors.torch import load_file

    from angpt.cli import main

    from .test_train import run_cli

    src = tmp_path / "tf"
    assert run_cli("--arch", "tokenformer", "--data", data_dir, *TINY, "--out", src, "--train.max_steps", "1") == 0

    def grow(name, seed):
        out = tmp_path / name
        assert main(["grow", str(src), str(out), "--add-tokens", "8", "--seed", str(seed)]) == 0
        return load_file(str(out / "model.safetensors"))

    a, b, c = grow("a", 0), grow("b", 0), grow("c", 1)
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_the_resume_check_itself_refuses_every_fixed_setting(data_dir, tmp_path):
    """The decision, not a later guard: check_resume refuses a changed fixed field from the run's recorded config
    alone, before any optimizer state is loaded. (Without `lr` among the fixed fields, the scheduler's restored
    peak rate would still refuse a changed rate, later and in other words; this test fails then.)"""
    from angpt.checkpoint import RunState
    from angpt.data import data_identity
    from angpt.errors import UserError
    from angpt.train.config import load_run_config, load_yaml
    from angpt.train.record import read_state_record
    from angpt.train.resume import FIXED_TRAIN, check_resume
    from angpt.train.setup import resolve

    out = tmp_path / "run"
    common = ["--arch", "gpt+", "--data", data_dir, *TINY, "--out", out, "--train.save_every", "0"]
    args = ["--train.max_steps", "4", "--train.stop_at", "2", "--train.lr", "0.002", "--train.dtype", "fp32"]
    assert run_cli(*common, *args) == 0
    ckpt = sorted((out / "checkpoints").glob("step_*"))[-1]
    state = RunState.read(ckpt)
    recorded = read_state_record(json.loads((ckpt / "state.json").read_text()), ckpt)
    values = {"lr": 0.01, "weight_decay": 0.3, "warmup_steps": 2, "min_lr_ratio": 0.2, "schedule": "wsd"}
    values |= {"decay_fraction": 0.5, "decay_shape": "linear", "beta1": 0.8, "beta2": 0.99, "grad_clip": 0.5}
    values |= {"batch_tokens": 1024, "micro_batch": 2, "seq_len": 32, "seed": 3, "dtype": "bf16"}
    tiny = {flag.lstrip("-"): load_yaml(v) for flag, v in zip(TINY[::2], TINY[1::2])}  # the run's own settings
    base = {**tiny, "arch": "gpt+", "data": str(data_dir), "train.max_steps": 4, "train.lr": 0.002}
    base |= {"train.save_every": 0, "train.dtype": "fp32"}

    def run(settings):  # the run these settings resolve to, as a new one (no folder of its own)
        cfg = load_run_config(None, settings)
        return resolve(cfg, device=torch.device("cpu"), meta=load_meta(data_dir), data_identity=data_identity(data_dir))

    assert check_resume(ckpt, recorded, run(base), state) == []
    assert set(FIXED_TRAIN) <= set(values)  # a new fixed field needs a value here
    for key in values:  # every field this test knows, whatever the module's list says today
        words = "computing in bf16" if key == "dtype" else rf"with train\.{key}="
        with pytest.raises(UserError, match=rf"cannot resume .* {words}"):
            check_resume(ckpt, recorded, run({**base, f"train.{key}": values[key]}), state)

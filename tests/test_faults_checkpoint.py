"""Checkpoint and export faults (issue 10): non-finite state, rotation across runs, bit rot, garbage state.json,
a disk that fills during a save, leftovers of a killed save, resuming a weights-only checkpoint, a truncated
safetensors import and user files in an export folder. Every error is one line (a CheckpointError / UserError)."""

import errno
import hashlib
import json
import os
import shutil

import pytest
import safetensors.torch
import torch

import angpt
from angpt import checkpoint as ckpt
from angpt.cli import main
from angpt.errors import CheckpointError
from angpt.hf import folder as export_folder
from angpt.hf.export import MARKER, export_hf, import_hf

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def model(tok):
    torch.manual_seed(0)
    return angpt.build_model("gpt+", "tiny", vocab_size=tok.vocab_size).eval()


@pytest.fixture(scope="module")
def tok_dir(tok, tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    tok.save(d)
    return d


def trainer_state(model, fill=0.0):
    """A trainer state shaped like the loop's: name-keyed Adam moments, scheduler, RNG."""
    state = {n: {"step": torch.tensor(3.0), "exp_avg": torch.full_like(p, fill)} for n, p in model.named_parameters()}
    groups = [{"lr": 1e-3, "params": [n for n, _ in model.named_parameters()]}]
    return {
        "optimizer": {"state": state, "param_groups": groups},
        "scheduler": {"last_epoch": 3, "_last_lr": [1e-3]},
        "rng": {"torch": torch.get_rng_state()},
    }


def save(out, step, model, *, run_id=None, keep_last=2, tok_dir=None, sd=None, trainer=None, **extra):
    state = {"tokens": step * 64, "data": {"epoch": 0, "cursor": step}, "model_config": model.config.to_dict()}
    kwargs = {"run_id": run_id} if run_id is not None else {}
    return ckpt.save_checkpoint(
        out,
        step,
        model.state_dict() if sd is None else sd,
        trainer_state(model) if trainer is None else trainer,
        {**state, **extra},
        tokenizer_dir=tok_dir,
        keep_last=keep_last,
        **kwargs,
    )


def save_imported(out, model, tok_dir=None):
    """What `angpt import-hf` writes: weights, an empty trainer state, no data cursor, keep_last=0."""
    state = {"model_config": model.config.to_dict(), "imported_from": "somewhere", "tokens": 0}
    return ckpt.save_checkpoint(out, 0, model.state_dict(), {}, state, tokenizer_dir=tok_dir, keep_last=0)


def one_line(excinfo, *needles):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def flip_byte(path, where=0.5):
    data = bytearray(path.read_bytes())
    i = int(len(data) * where)
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def steps(out):
    return sorted(p.name for p in (out / "checkpoints").iterdir())


# -------------------------------------------------------------------------------- 1. finite state only
def test_save_refuses_non_finite_model_or_optimizer_state(model, tmp_path):
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    name = sorted(sd)[1]
    sd[name].view(-1)[3] = float("nan")
    with pytest.raises(CheckpointError) as e:
        save(tmp_path, 10, model, sd=sd)
    one_line(e, name, "not finite", "step 10")
    assert not (tmp_path / "checkpoints").exists() or steps(tmp_path) == []

    trainer = trainer_state(model)
    pname = next(iter(trainer["optimizer"]["state"]))
    trainer["optimizer"]["state"][pname]["exp_avg"].view(-1)[0] = float("inf")
    with pytest.raises(CheckpointError) as e:
        save(tmp_path, 10, model, trainer=trainer)
    one_line(e, pname, "exp_avg", "not finite")
    assert not (tmp_path / "checkpoints").exists() or steps(tmp_path) == []

    good = save(tmp_path, 10, model)  # the RNG state (uint8) and integer tensors are not checked
    assert ckpt.checkpoint_is_finite(good)


def test_loading_non_finite_weights_is_refused(model, tok_dir, tmp_path, capsys):
    path = save(tmp_path / "run", 10, model, tok_dir=tok_dir)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    name = sorted(sd)[0]
    sd[name].view(-1)[0] = float("-inf")
    # A checkpoint written before the save-time check existed: NaN/inf weights, no checksums.
    safetensors.torch.save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    state = json.loads((path / "state.json").read_text())
    state.pop("files", None)
    (path / "state.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError) as e:
        ckpt.load_checkpoint_model(path)
    one_line(e, name, "not finite")
    assert not ckpt.checkpoint_is_finite(path)
    with pytest.raises(CheckpointError):
        ckpt.load_model_state(path)
    # `angpt export` of it exits 2 with one line and writes nothing.
    assert main(["export", str(path), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not finite" in err[0], err
    assert not (tmp_path / "hf").exists()


def test_last_good_checkpoint_skips_corrupt_and_non_finite_ones(model, tmp_path):
    good = save(tmp_path, 10, model, run_id="r", keep_last=0)
    save(tmp_path, 15, model, run_id="other", keep_last=0)
    flip_byte(save(tmp_path, 20, model, run_id="r", keep_last=0) / "model.safetensors", 0.9)
    nan = save(tmp_path, 30, model, run_id="r", keep_last=0)  # NaN weights written by an older angpt, unchecked
    sd = {k: torch.full_like(v, float("nan")) for k, v in model.state_dict().items()}
    safetensors.torch.save_file(sd, str(nan / "model.safetensors"), metadata={"format": "pt"})
    state = json.loads((nan / "state.json").read_text())
    del state["files"]
    (nan / "state.json").write_text(json.dumps(state))
    assert ckpt.last_good_checkpoint(tmp_path, run_id="r") == good
    assert ckpt.last_good_checkpoint(tmp_path).name == "step_000015"
    assert ckpt.last_good_checkpoint(tmp_path / "empty") is None


# ------------------------------------------------------------------------------ 2. rotation per run_id
def test_rotation_touches_only_checkpoints_of_its_own_run(model, tmp_path):
    out = tmp_path / "run"
    save_imported(out, model)  # step_000000: an imported checkpoint
    save(out, 50, model, run_id="other-run", keep_last=1)  # another run's checkpoint in the same folder
    (out / "checkpoints" / "step_000070").mkdir()  # a folder with an unreadable state.json is never deleted
    (out / "checkpoints" / "step_000070" / "state.json").write_text("{garbage")
    for step in (10, 20, 30):
        save(out, step, model, run_id="mine", keep_last=2)
    assert steps(out) == ["step_000000", "step_000020", "step_000030", "step_000050", "step_000070"]
    assert ckpt.read_state(out / "checkpoints" / "step_000030")["run_id"] == "mine"
    save(out, 40, model, keep_last=1)  # legacy (no run_id): only checkpoints without a run_id rotate
    assert steps(out) == ["step_000000", "step_000020", "step_000030", "step_000040", "step_000050", "step_000070"]


def test_legacy_rotation_never_deletes_an_imported_checkpoint(model, tmp_path):
    save_imported(tmp_path, model)
    for step in (10, 20, 30):
        save(tmp_path, step, model, keep_last=1)
    assert steps(tmp_path) == ["step_000000", "step_000030"]


def test_rotation_never_deletes_the_checkpoint_it_just_wrote(model, tmp_path):
    out = tmp_path / "run"
    save(out, 30, model, keep_last=1)
    save(out, 10, model, keep_last=1)  # a lower step written later (resumed from an older one)
    assert "step_000010" in steps(out)


# ------------------------------------------------------------------------------------- 3. bit rot
def test_checksums_are_recorded_and_verified_on_every_load_path(model, tok_dir, tmp_path, capsys):
    path = save(tmp_path / "run", 10, model, tok_dir=tok_dir)
    files = ckpt.read_state(path)["files"]
    assert set(files) == {"model.safetensors", "trainer.pt", "tokenizer.json", "angpt_tokenizer.json"}
    for name, digest in files.items():
        assert hashlib.sha256((path / name).read_bytes()).hexdigest() == digest
    ckpt.verify_checkpoint(path)

    for name in ("model.safetensors", "trainer.pt", "tokenizer.json"):
        bad = tmp_path / f"bad-{name}"
        shutil.copytree(path, bad)
        flip_byte(bad / name, 0.9)  # inside the tensor data: the file still parses
        with pytest.raises(CheckpointError) as e:
            ckpt.verify_checkpoint(bad)
        one_line(e, name, "does not match its checksum", str(bad))
        if name == "trainer.pt":  # what generate, export and eval load (below) does not include trainer.pt
            ckpt.load_checkpoint_model(bad)
        else:
            with pytest.raises(CheckpointError, match=f"{name} does not match"):
                ckpt.load_checkpoint_model(bad)  # generate, export and eval load through this
        if name == "model.safetensors":
            with pytest.raises(CheckpointError, match="model.safetensors does not match"):
                ckpt.load_model_state(bad)  # resume and --init_from
            assert main(["generate", str(bad), "--prompt", "a"]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "checksum" in err[0], err
        if name == "trainer.pt":
            with pytest.raises(CheckpointError, match="trainer.pt does not match"):
                ckpt.load_trainer_state(bad)  # resume
    missing = tmp_path / "missing"
    shutil.copytree(path, missing)
    (missing / "angpt_tokenizer.json").unlink()
    with pytest.raises(CheckpointError) as e:
        ckpt.verify_checkpoint(missing)
    one_line(e, "angpt_tokenizer.json", "missing")

    # A checkpoint from before checksums (no "files") loads without a check.
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "bad-trainer.pt", old)
    state = json.loads((old / "state.json").read_text())
    del state["files"]
    (old / "state.json").write_text(json.dumps(state))
    ckpt.verify_checkpoint(old)
    ckpt.load_model_state(old)


# --------------------------------------------------------------------------------- 4. garbage state.json
@pytest.mark.parametrize(
    "content, needles",
    [
        ("{not json", ["state.json", "not valid JSON"]),
        ("", ["state.json", "not valid JSON"]),
        ("[1, 2]", ["state.json", "JSON object"]),
        (json.dumps({"step": 10}), ["state.json", "model_config"]),
        (json.dumps({"step": "ten", "model_config": {}}), ["state.json", "step"]),
        (json.dumps({"step": 10, "model_config": [1]}), ["state.json", "model_config"]),
        (json.dumps({"step": 10, "model_config": {"d_model": "wide"}}), ["state.json", "model_config"]),
        (json.dumps({"step": 10, "model_config": {"bogus": 1}}), ["state.json", "model_config"]),
        (json.dumps({"step": 10, "model_config": {}, "files": ["x"]}), ["state.json", "files"]),
        (json.dumps({"step": 10, "model_config": {}, "files": {"../model.safetensors": "0" * 64}}), ["files"]),
        (json.dumps({"step": 10, "model_config": {}, "files": {"model.safetensors": "not-a-digest"}}), ["files"]),
    ],
)
def test_garbage_state_json_is_a_one_line_error(model, tmp_path, content, needles):
    path = save(tmp_path, 10, model)
    (path / "state.json").write_text(content)
    with pytest.raises(CheckpointError) as e:
        ckpt.load_checkpoint_model(path)
    one_line(e, *needles)
    with pytest.raises(CheckpointError) as e:
        ckpt.validate_checkpoint(path, need_trainer=True)
    one_line(e, "state.json")


def test_resume_needs_the_data_cursor_in_state_json(model, tmp_path):
    path = save(tmp_path, 10, model)
    state = json.loads((path / "state.json").read_text())
    for key in ("data", "tokens"):
        broken = dict(state)
        del broken[key]
        (path / "state.json").write_text(json.dumps(broken))
        with pytest.raises(CheckpointError) as e:
            ckpt.resolve_resume(tmp_path, "auto")
        one_line(e, "state.json", key)
    broken = {**state, "data": "cursor"}
    (path / "state.json").write_text(json.dumps(broken))
    with pytest.raises(CheckpointError) as e:
        ckpt.resolve_resume(tmp_path, str(path))
    one_line(e, "state.json", "data")


# ------------------------------------------------------------------------------------- 5. disk full
@pytest.mark.parametrize("writer", ["safetensors", "torch.save"])
def test_disk_full_during_a_save_keeps_the_previous_checkpoint(model, tmp_path, monkeypatch, writer):
    prev = save(tmp_path, 10, model, keep_last=1)
    before = {p.name: p.read_bytes() for p in prev.iterdir()}

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if writer == "safetensors":
        monkeypatch.setattr(safetensors.torch, "save_file", full)
    else:
        monkeypatch.setattr(torch, "save", full)
    with pytest.raises(CheckpointError) as e:
        save(tmp_path, 20, model, keep_last=1)
    one_line(e, "disk full", "step 20")
    monkeypatch.undo()
    assert steps(tmp_path) == ["step_000010"]  # no temporary folder left, the previous checkpoint kept
    assert {p.name: p.read_bytes() for p in prev.iterdir()} == before
    ckpt.verify_checkpoint(prev)


def test_the_real_writers_failure_is_the_same_one_line_error(model, tmp_path, monkeypatch):
    """safetensors raises its own SafetensorError (no OSError; the errno only in its message) when the disk fills:
    the exact exception a full disk gave during a 300-step sweep (2026-11-26) is the same one-line "disk full" as an
    OSError. And the real writer, made to fail by a file-size limit (EFBIG), is a one-line CheckpointError that keeps
    the previous checkpoint, not a traceback."""
    import resource

    from safetensors import SafetensorError

    prev = save(tmp_path, 10, model, keep_last=1)

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(CheckpointError) as e:
        save(tmp_path, 20, model, keep_last=1)
    one_line(e, "disk full", "step 20", "No space left on device")
    monkeypatch.undo()

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # CPython ignores SIGXFSZ: the write fails with EFBIG
    try:
        with pytest.raises(CheckpointError) as e:
            save(tmp_path, 30, model, keep_last=1)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    one_line(e, "could not write checkpoint step 30", "File too large", "previous checkpoints are kept")
    assert steps(tmp_path) == ["step_000010"]
    ckpt.verify_checkpoint(prev)


# ----------------------------------------------------------------------------- 6. leftovers of a killed save
def test_clean_stale_tmp_removes_leftovers_of_a_killed_save(model, tmp_path):
    out = tmp_path
    save(out, 10, model)
    root = out / "checkpoints"
    dead = 999_999_999  # no such process
    (root / f".tmp_step_000020_{dead}").mkdir()
    (root / f".tmp_step_000020_{dead}" / "model.safetensors").write_bytes(b"half")
    (root / f".tmp_step_000030_{os.getpid()}").mkdir()  # this process is not saving: stale too
    alive = root / f".tmp_step_000040_{os.getppid()}"  # a live process may be mid-save: left alone
    alive.mkdir()
    # Killed between moving the old step_000010 aside and renaming the new one in: the old one comes back.
    os.replace(root / "step_000010", root / f".old_step_000010_{dead}")
    removed = ckpt.clean_stale_tmp(out)
    assert sorted(p.name for p in removed) == sorted([f".tmp_step_000020_{dead}", f".tmp_step_000030_{os.getpid()}"])
    assert steps(out) == [alive.name, "step_000010"]
    ckpt.verify_checkpoint(root / "step_000010")
    # A leftover .old_step_* whose step exists again is removed.
    shutil.copytree(root / "step_000010", root / f".old_step_000010_{dead}")
    ckpt.clean_stale_tmp(out)
    assert steps(out) == [alive.name, "step_000010"]
    assert ckpt.clean_stale_tmp(tmp_path / "nothing-here") == []


def test_a_kill_during_the_best_checkpoints_swap_loses_neither(model, tmp_path):
    """The trainer writes a new best as .best_new_PID, moves best aside to .best_old_PID, then renames the new one
    in. Killed between the two renames, the folder has no best: the next start puts the complete new one in place
    (else the old one back) and removes what is left, half-written copies included."""
    root = tmp_path / "checkpoints"
    dead = 999_999_999
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ckpt.save_weights_checkpoint(root / f".best_old_{dead}", weights, {"model_config": {}, "best_val_loss": 2.0})
    ckpt.save_weights_checkpoint(root / f".best_new_{dead}", weights, {"model_config": {}, "best_val_loss": 1.5})
    (root / f".best_new_{dead}.tmp_{dead}").mkdir()  # an earlier kill, mid-write
    removed = ckpt.clean_stale_tmp(tmp_path)
    assert json.loads((root / "best" / "state.json").read_text())["best_val_loss"] == 1.5
    assert sorted(p.name for p in removed) == sorted([f".best_old_{dead}", f".best_new_{dead}.tmp_{dead}"])
    assert sorted(p.name for p in root.iterdir()) == ["best"]
    ckpt.verify_checkpoint(root / "best")
    # Killed after moving the old one aside but before the new one was complete: the old one comes back.
    os.replace(root / "best", root / f".best_old_{dead}")
    (root / f".best_new_{dead}.tmp_{dead}").mkdir()
    ckpt.clean_stale_tmp(tmp_path)
    assert json.loads((root / "best" / "state.json").read_text())["best_val_loss"] == 1.5
    assert sorted(p.name for p in root.iterdir()) == ["best"]
    # A live process's swap is left alone.
    alive = root / f".best_new_{os.getppid()}"
    shutil.copytree(root / "best", alive)
    ckpt.clean_stale_tmp(tmp_path)
    assert alive.is_dir()


# ------------------------------------------------------------------------- 7. resuming a weights-only checkpoint
def test_resume_of_an_imported_checkpoint_says_use_init_from(model, tmp_path):
    path = save_imported(tmp_path, model)
    for resume in ("auto", str(path), str(tmp_path)):
        with pytest.raises(CheckpointError) as e:
            ckpt.resolve_resume(tmp_path, resume)
        one_line(e, "--init_from", str(path))
    with pytest.raises(CheckpointError) as e:
        ckpt.load_trainer_state(path)
    one_line(e, "--init_from")
    ckpt.validate_checkpoint(path, need_trainer=False)  # still fine as --init_from


# ---------------------------------------------------------------------------- 8. truncated import-hf
def test_import_of_a_truncated_safetensors_file_is_a_one_line_error(model, tok, tmp_path, capsys):
    out = export_hf(model, tmp_path / "hf", tok)
    weights = out / "model.safetensors"
    data = weights.read_bytes()
    for cut in (len(data) // 2, 4, 0):
        weights.write_bytes(data[:cut])
        with pytest.raises(CheckpointError) as e:
            import_hf(out)
        one_line(e, "model.safetensors")
        assert main(["import-hf", str(out), str(tmp_path / "imported")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "model.safetensors" in err[0], err
    weights.unlink()
    (out / "model.safetensors.index.json").write_text("{garbage")
    with pytest.raises(CheckpointError) as e:
        import_hf(out)
    one_line(e, "model.safetensors.index.json")
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "model-00001.safetensors"}}))
    with pytest.raises(CheckpointError) as e:
        import_hf(out)
    one_line(e, "model-00001.safetensors")


# --------------------------------------------------------------------------------- 9. export keeps user files
def test_re_export_keeps_user_files_and_replaces_its_own(model, tok, tmp_path):
    folded = angpt.build_model("angpt", "tiny", vocab_size=tok.vocab_size).eval()
    out = export_hf(folded, tmp_path / "hf", tok)
    assert (out / "modeling_angpt.py").is_file()
    (out / "notes.txt").write_text("keep me")
    (out / "results").mkdir()
    (out / "results" / "eval.json").write_text("{}")

    export_hf(model, out, overwrite=True)  # a GPT+ without a tokenizer over the folded export with one
    assert (out / "notes.txt").read_text() == "keep me"
    assert (out / "results" / "eval.json").read_text() == "{}"
    # The previous export's own files that this export does not write are gone (a stale tokenizer or modelling
    # file would not belong to the new weights); the new export loads.
    assert not (out / "modeling_angpt.py").exists() and not (out / "tokenizer.json").exists()
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3"
    assert "notes.txt" not in json.loads((out / MARKER).read_text())["files"]
    back = import_hf(out)
    x = torch.tensor([tok.encode("the lazy dog")])
    assert torch.equal(back(x)[0], model(x)[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no temporary folders left


def test_re_export_failing_while_moving_files_restores_the_previous_export(model, tok, tmp_path, monkeypatch):
    out = export_hf(model, tmp_path / "hf", tok)
    (out / "notes.txt").write_text("keep me")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    folded = angpt.build_model("angpt", "tiny", vocab_size=tok.vocab_size).eval()
    real, calls = os.replace, []

    def flaky(src, dst):
        calls.append((src, dst))
        if len(calls) == 12:  # after the previous files were moved aside and some new ones moved in
            raise OSError(errno.EIO, "I/O error")
        return real(src, dst)

    monkeypatch.setattr(export_folder.os, "replace", flaky)
    with pytest.raises(CheckpointError) as e:
        export_hf(folded, out, tok, overwrite=True)
    one_line(e, "could not write the export", "I/O error", "nothing there changed")
    monkeypatch.undo()
    assert len(calls) >= 12
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_export_on_a_full_disk_is_one_line_and_keeps_the_previous_export(model, tok_dir, tmp_path, monkeypatch, capsys):
    """`angpt export` when safetensors' writer meets a full disk (its own SafetensorError, as a real one raised it):
    exit 2, one line naming the cause, the previous export byte for byte, no temporary folder left."""
    from safetensors import SafetensorError

    path = ckpt.save_weights_checkpoint(
        tmp_path / "ckpt", model.state_dict(), {"model_config": model.config.to_dict()}, tokenizer_dir=tok_dir
    )
    out = tmp_path / "hf"
    assert main(["export", str(path), str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    assert main(["export", str(path), str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not write the export" in err[0] and "No space left on device" in err[0], err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "hf"]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_weights_get_the_mode_of_every_other_file(tmp_path, umask):
    """safetensors writes 0600 whatever the umask: an exported model.safetensors another user could not read beside
    a config.json they could (issue 48). Ours gets the umask's mode, as a plain file does."""
    import os

    from angpt.checkpoint import save_safetensors

    old = os.umask(umask)
    try:
        save_safetensors({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
        (tmp_path / "config.json").write_text("{}")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == {"model.safetensors": 0o666 & ~umask, "config.json": 0o666 & ~umask}

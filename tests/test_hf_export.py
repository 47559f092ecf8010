"""Hugging Face export: GPT+ -> Qwen3, GPT -> Llama, nGPT / anGPT and any model with LAUREL -> folded custom classes
(loadable without angpt), import back, tokenizer files, HF generate with and without cache, and safe writing of the
folder."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers

import angpt
from angpt.data.tokenizer import load_tokenizer
from angpt.errors import CheckpointError, UserError
from angpt.hf import export as export_mod
from angpt.hf.export import MARKER, export_hf, import_hf
from angpt.infer import generate

TEXT = "The quick brown fox jumps over the lazy dog. A stitch in time saves nine. All that glitters is not gold. "

pytestmark = pytest.mark.usefixtures("one_thread")


def trained(arch, tok, steps=20, text=TEXT * 4, window=32, **overrides):
    """A tiny model after a few Adam steps on `text` (windows of `window` tokens): gains, scales and alphas are no
    longer at their initial values, and greedy decoding has clear winners rather than ties."""
    torch.manual_seed(0)
    model = angpt.build_model(arch, "tiny", vocab_size=tok.vocab_size, **overrides)
    opt, _ = angpt.make_optimizer(model, lr=1e-2, max_steps=steps)
    angpt.attach_constraints(model, opt)
    data = torch.tensor(tok.encode(text))
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - window - 1, (8,), generator=gen)
        batch = torch.stack([data[s : s + window + 1] for s in starts])
        model(batch[:, :-1], batch[:, 1:])[1].backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


@pytest.fixture(scope="module")
def models(tok):
    return {
        "gpt+": trained("gpt+", tok),
        "gpt": trained("gpt", tok),
        "ln_scaling": trained("gpt+", tok, norm="ln_scaling"),
        "ngpt": trained("ngpt", tok),
        "angpt": trained("angpt", tok),  # its defaults: an exact norm of the MLP input (model.input_norm=mlp)
        "angpt-block": trained("angpt", tok, input_norm="block"),
        # anGPT's defaults before 2026-11-25: the paper's block and attention factor, nGPT's alpha and logit scale
        "angpt-paper": trained(
            "angpt", tok, input_norm="none", s_z_init=1.0, alpha_init=0.05, alpha_speed=1.0, nu_att="dense"
        ),
        "angpt-gelu": trained("angpt", tok, activation="gelu", qk_norm_mode="none"),  # the config's act. and QK mode
        "gpt+laurel": trained("gpt+", tok, laurel="rw+lr+pa", laurel_rw_shape="vector"),  # the "prenorm" form
        "angpt-laurel": trained("angpt", tok, laurel="rw+lr+pa"),
        "gpt+wn-laurel": trained("gpt+wn", tok, laurel="rw+lr"),  # W = g V/||V|| and LAUREL both folded
        "gpt+wn": trained("gpt+wn", tok),  # folded (W = g V/||V||) into a plain GPT+, then Qwen3
        "angpt_frozen_alpha": trained("angpt", tok, freeze_alpha=True),  # exports as its base, anGPT
    }


@pytest.fixture(scope="module")
def exports(models, tok, tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    return {name: export_hf(m, root / name, tok) for name, m in models.items()}


def ids(tok, n=2, length=20):
    data = tok.encode(TEXT)
    return torch.tensor([data[i * 9 : i * 9 + length] for i in range(n)])


def hf_greedy(hf_model, x, n=12, use_cache=True):
    out = hf_model.generate(x, max_new_tokens=n, do_sample=False, use_cache=use_cache)
    return out[:, x.shape[1] :]


@pytest.mark.parametrize(
    "name,cls",
    [
        ("gpt+", "Qwen3ForCausalLM"),
        ("gpt", "LlamaForCausalLM"),
        ("ln_scaling", "Qwen3ForCausalLM"),
        ("gpt+wn", "Qwen3ForCausalLM"),
    ],
)
def test_gpt_family_exports_as_native_transformers_model(models, exports, tok, name, cls):
    ours, out = models[name], exports[name]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)  # no trust_remote_code: a native class
    assert type(hf).__name__ == cls
    assert json.loads((out / "config.json").read_text()).get("auto_map") is None
    x = ids(tok)
    with torch.no_grad():
        expected = ours(x)[0]
        assert torch.allclose(hf(x).logits, expected, atol=1e-5)
        assert torch.equal(import_hf(out)(x)[0], expected) or torch.allclose(import_hf(out)(x)[0], expected, atol=1e-6)
    greedy = hf_greedy(hf, x)
    assert torch.equal(greedy, hf_greedy(hf, x, use_cache=False))
    assert torch.equal(greedy, generate(ours, x, max_new_tokens=12, temperature=0)[:, x.shape[1] :])


def test_import_hf_reproduces_gpt_plus_exactly(models, exports, tok):
    back = import_hf(exports["gpt+"])
    assert back.config.arch == "gpt+" and back.config.qk_norm
    x = ids(tok)
    with torch.no_grad():
        assert torch.equal(back(x)[0], models["gpt+"](x)[0])
    assert import_hf(exports["gpt"]).config.arch == "gpt"


@pytest.mark.parametrize(
    "arch",
    ["ngpt", "angpt", "angpt-block", "angpt-paper", "angpt-gelu", "gpt+laurel", "angpt-laurel", "gpt+wn-laurel"]
    + ["angpt_frozen_alpha"],
)
def test_folded_export_with_angpt_registered(models, exports, tok, arch):
    ours, out = models[arch], exports[arch]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "angpt_folded" and "AutoModelForCausalLM" in cfg["auto_map"]
    assert (out / "modeling_angpt.py").is_file()
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)  # registered by importing angpt.hf.export
    assert type(hf).__module__ == "angpt.hf.modeling_angpt"
    folded = angpt.fold_for_inference(ours)
    x = ids(tok)
    with torch.no_grad():
        logits = hf(x).logits
        assert torch.allclose(logits, folded(x)[0], atol=1e-5)
        train_logits = ours(x)[0]  # folding itself moves logits by float rounding only
        assert torch.allclose(logits, train_logits, atol=1e-4 * train_logits.abs().max().item())
        assert torch.equal(import_hf(out)(x)[0], folded(x)[0])
    greedy = hf_greedy(hf, x)
    assert torch.equal(greedy, hf_greedy(hf, x, use_cache=False))
    assert torch.equal(greedy, generate(folded, x, max_new_tokens=12, temperature=0)[:, x.shape[1] :])


def masked_labels(x):
    """x with -100 (ignored) on the first 7 labels of row 0 and the last 5 of row 1."""
    labels = x.clone()
    labels[0, :7] = -100
    labels[1, -5:] = -100
    return labels


@pytest.mark.parametrize("name", ["gpt+", "gpt", "ngpt", "angpt"])
def test_hf_loss_with_labels_equals_ours(models, exports, tok, name):
    """transformers' convention: `labels` are the inputs themselves, shifted inside the model (position t predicts
    labels[t + 1]), -100 ignored, mean over the counted labels -- or their sum / num_items_in_batch, which
    Trainer passes under gradient accumulation. Ours: model(x[:, :-1], x[:, 1:])."""
    ours = models[name]
    hf = transformers.AutoModelForCausalLM.from_pretrained(exports[name])  # native, or the registered folded class
    x = ids(tok)
    labels = masked_labels(x)
    n = int((labels[:, 1:] != -100).sum())
    with torch.no_grad():
        expected = ours(x[:, :-1], x[:, 1:])[1]
        expected_masked = ours(x[:, :-1], labels[:, 1:])[1]
        assert hf(input_ids=x, labels=x).loss.item() == pytest.approx(expected.item(), rel=1e-5)
        assert hf(input_ids=x, labels=labels).loss.item() == pytest.approx(expected_masked.item(), rel=1e-5)
        # num_items_in_batch: the sum over this micro-batch's labels divided by the whole batch's count
        summed = hf(input_ids=x, labels=labels, num_items_in_batch=torch.tensor(4 * n)).loss
        assert summed.item() == pytest.approx(expected_masked.item() / 4, rel=1e-5)
        # shift_labels (already shifted, as sequence-parallel training passes them) replace the shifted `labels`
        shifted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
        assert hf(input_ids=x, labels=x, shift_labels=shifted).loss.item() == pytest.approx(
            expected_masked.item(), rel=1e-5
        )


def test_folded_hf_generate_left_padding_equals_single(exports, tok):
    hf = transformers.AutoModelForCausalLM.from_pretrained(exports["angpt"])
    short, long = tok.encode("lazy dog. A"), tok.encode("over the lazy dog. A")
    pad = len(long) - len(short)
    x = torch.tensor([[tok.eos_id] * pad + short, long])
    mask = torch.tensor([[0] * pad + [1] * len(short), [1] * len(long)])
    batched = hf.generate(x, attention_mask=mask, max_new_tokens=12, do_sample=False)[:, x.shape[1] :]
    alone = hf_greedy(hf, torch.tensor([short]))
    assert torch.equal(batched[0], alone[0])


def test_tokenizer_files_load_offline(exports, tok):
    out = exports["angpt"]
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert isinstance(hf_tok, transformers.PreTrainedTokenizerFast)
    assert hf_tok.eos_token == "<|endoftext|>" and hf_tok.eos_token_id == tok.eos_id == 256
    text = "héllo wörld, 1 + 1 = 2"
    assert hf_tok(text).input_ids == tok.encode(text)
    assert hf_tok.decode(tok.encode(text)) == text
    assert load_tokenizer(out).encode(text) == tok.encode(text)
    gen_cfg = json.loads((out / "generation_config.json").read_text())
    assert gen_cfg["eos_token_id"] == gen_cfg["pad_token_id"] == 256


def test_folded_export_loads_where_angpt_is_not_importable(models, exports, tok, tmp_path):
    """trust_remote_code=True in a fresh interpreter where angpt cannot be imported: only torch + transformers."""
    x = ids(tok)
    archs = ("ngpt", "angpt", "gpt+laurel", "angpt-laurel")
    spec = {"ids": x.tolist(), "exports": {a: str(exports[a]) for a in archs}}
    (tmp_path / "in.json").write_text(json.dumps(spec))
    script = textwrap.dedent(
        """
        import json, sys
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        spec = json.load(open("in.json"))
        x = torch.tensor(spec["ids"])
        res = {}
        for name, path in spec["exports"].items():
            m = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)
            with torch.no_grad():
                logits = m(x).logits
                labels = x.clone()
                labels[0, :7] = -100
                labels[1, -5:] = -100
                loss = m(input_ids=x, labels=labels).loss.item()
                n = int((labels[:, 1:] != -100).sum())
                loss_sum = m(input_ids=x, labels=labels, num_items_in_batch=torch.tensor(4 * n)).loss.item()
            g = lambda c: m.generate(x, max_new_tokens=12, do_sample=False, use_cache=c)[:, x.shape[1]:].tolist()
            t = AutoTokenizer.from_pretrained(path)
            res[name] = dict(module=type(m).__module__, logits=logits.tolist(), cached=g(True), uncached=g(False),
                             eos=t.eos_token_id, enc=t("héllo").input_ids, loss=loss, loss_sum=loss_sum)
        res["angpt_loaded"] = sorted(k for k, v in sys.modules.items() if v is not None and k.split(".")[0] == "angpt")
        json.dump(res, open("out.json", "w"))
        """
    )
    res = run_isolated(script, tmp_path)
    assert res["angpt_loaded"] == []
    for arch in archs:
        r = res[arch]
        assert r["module"].startswith("transformers_modules.")
        folded = angpt.fold_for_inference(models[arch])
        with torch.no_grad():
            assert torch.allclose(torch.tensor(r["logits"]), folded(x)[0], atol=1e-5)
            labels = masked_labels(x)
            expected = models[arch](x[:, :-1], labels[:, 1:])[1].item()  # the training model's own loss
        assert r["loss"] == pytest.approx(expected, rel=1e-5) and r["loss_sum"] == pytest.approx(expected / 4, rel=1e-5)
        assert r["cached"] == r["uncached"] == generate(folded, x, max_new_tokens=12, temperature=0)[:, 20:].tolist()
        assert r["eos"] == tok.eos_id and r["enc"] == tok.encode("héllo")


def test_bf16_export(models, tok, tmp_path):
    out = export_hf(models["angpt"], tmp_path / "bf16", tok, dtype="bfloat16")
    # the stored dtype: transformers 5 loads it by default, 4.x when asked for "auto" (under its old keyword)
    auto = {"dtype": "auto"} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": "auto"}
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, **auto)
    assert hf.lm_head.weight.dtype == torch.bfloat16
    x = ids(tok)
    with torch.no_grad():
        ref = angpt.fold_for_inference(models["angpt"])(x)[0]
        got = hf(x).logits.float()
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()


def test_export_names_its_dtype_for_both_majors_without_a_deprecation_warning(models, tok, tmp_path, monkeypatch):
    """config.json names the dtype under transformers 5's `dtype` and 4.x's `torch_dtype`, so that an export made
    with one loads with the other; and on transformers 5 the export logs nothing (setting `torch_dtype` on its config
    printed "`torch_dtype` is deprecated!" on every `angpt export`)."""
    from transformers import configuration_utils

    logged = []
    monkeypatch.setattr(configuration_utils.logger, "warning_once", lambda *a, **k: logged.append(a))
    out = export_hf(models["angpt"], tmp_path / "bf16", tok, dtype="bfloat16")
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "bfloat16", config
    assert not logged, logged


def test_bad_exports_fail_cleanly(models, tok, tmp_path, monkeypatch):
    gpt = models["gpt+"]
    with pytest.raises(UserError, match="unknown export format 'onnx'"):
        export_hf(gpt, tmp_path / "a", format="onnx")
    with pytest.raises(UserError, match="unknown export dtype"):
        export_hf(gpt, tmp_path / "a", dtype="int3")
    with pytest.raises(UserError, match="exports as 'folded', not 'qwen3'"):
        export_hf(models["angpt"], tmp_path / "a", format="qwen3")
    with pytest.raises(UserError, match="DyT"):
        export_hf(angpt.build_model("gpt+", "tiny", norm="dyt"), tmp_path / "a")
    with pytest.raises(UserError, match="DyT"):
        export_hf(angpt.build_model("gpt+", "tiny", norm="dyt", laurel="lr"), tmp_path / "a")
    with pytest.raises(UserError, match="exports as 'folded', not 'qwen3'"):  # Qwen3 has no LAUREL
        export_hf(models["gpt+laurel"], tmp_path / "a", format="qwen3")
    with pytest.raises(UserError, match=r"export is not supported for gpt\+cos \(model.attention=cosine\)"):
        export_hf(angpt.build_model("gpt+cos", "tiny"), tmp_path / "a", tok)
    with pytest.raises(UserError, match=r"export is not supported for gpt\+cos \(model.attention=cosine\)"):
        export_hf(angpt.build_model("gpt+cos", "tiny", laurel="rw+lr"), tmp_path / "a", tok)
    assert os.listdir(tmp_path) == []

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="not empty and is not a previous angpt export"):
        export_hf(gpt, busy, tok)
    assert os.listdir(busy) == ["notes.txt"]

    # A failure while writing leaves a previous export as it was, and no temporary folder behind.
    prev = export_hf(gpt, tmp_path / "prev", tok)
    before = {p.name: p.read_bytes() for p in prev.iterdir()}

    def disk_full(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export_mod, "_save_weights", disk_full)
    with pytest.raises(CheckpointError, match=r"could not write the export .* \(disk full\); nothing there changed"):
        export_hf(models["angpt"], prev, tok, overwrite=True)
    with pytest.raises(CheckpointError, match=r"could not write the export .* \(disk full\); nothing there changed"):
        export_hf(models["angpt"], tmp_path / "fresh", tok)
    assert {p.name: p.read_bytes() for p in prev.iterdir()} == before
    assert sorted(os.listdir(tmp_path)) == ["busy", "prev"]
    monkeypatch.undo()

    # Re-exporting over a previous export is refused, untouched, unless asked; an empty folder is fine too.
    with pytest.raises(UserError, match="holds a previous export; pass --overwrite"):
        export_hf(models["angpt"], prev, tok)
    assert {p.name: p.read_bytes() for p in prev.iterdir()} == before
    export_hf(models["angpt"], prev, tok, overwrite=True)
    assert json.loads((prev / "config.json").read_text())["model_type"] == "angpt_folded"
    assert json.loads((prev / MARKER).read_text())["arch"] == "angpt"
    (tmp_path / "empty").mkdir()
    export_hf(gpt, tmp_path / "empty")
    assert sorted(os.listdir(tmp_path)) == ["busy", "empty", "prev"]


def test_import_hf_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        import_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="'bert'"):
        import_hf(tmp_path)


# Run first in every isolated script: -I drops PYTHONPATH and the cwd; this removes the editable install's path
# entry and adds a finder that refuses angpt in case it is installed into site-packages itself (a wheel install),
# then checks that angpt really cannot be imported (else a test would prove nothing).
WITHOUT_ANGPT = """
import importlib.abc, os, sys
sys.path = [p for p in sys.path if os.path.realpath(p or ".") != {src!r}]

class NoAngpt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "angpt":
            raise ModuleNotFoundError("angpt is not installed here", name=name)

sys.meta_path.insert(0, NoAngpt())
try:
    import angpt
except ImportError:
    pass
else:
    raise SystemExit("angpt is importable in the isolated interpreter: the test would prove nothing")
"""


def run_isolated(script: str, tmp_path) -> dict:
    """Run `script` in a fresh, isolated (-I) offline Python in `tmp_path` with its own HF caches, where angpt
    cannot be imported (WITHOUT_ANGPT runs first); the JSON it wrote to out.json. Proves a loader works where only
    torch, transformers and what the export ships are available."""
    src = str(Path(angpt.__file__).resolve().parent.parent)
    script = WITHOUT_ANGPT.format(src=src) + script
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-I", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "out.json").read_text())

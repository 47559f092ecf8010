"""Generation of every exportable architecture through transformers is correct by construction: the exported model's
cached greedy generation equals its uncached generation and our own `angpt generate`, on long prompts, with left
padding, at batch > 1, and past 64 new tokens; and its cached logits, fed token by token without `generate`, equal
the full forward's. These are the tests `make test-compat` runs on the newest and the oldest transformers we declare
(transformers 5.24 renamed the cache `past_key_values` -> `cache` and our folded class silently ignored it)."""

import pytest
import torch
import transformers
from transformers.modeling_outputs import CausalLMOutputWithPast

import angpt
from angpt.errors import UserError
from angpt.hf.export import export_hf
from angpt.infer import generate
from angpt.models import registry

from . import test_hf_export as export_tests

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = (
    "def main(args):\n    total = 0\n    for item in args.items:\n        total += item.size\n    return total\n\n"
    "class Stack:\n    def push(self, x):\n        self.items.append(x)\n"
    "    def pop(self):\n        return self.items.pop()\n"
)
CONTEXT = 192  # prompts of up to 100 tokens, then 80 new ones
NEW = 80
# where this transformers returns the cache: `cache` from 5.24 on, `past_key_values` before
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
# gpt+cos has no transformers form (see below). angpt-dense: the paper's per-position attention factor nu_att[t]
# (anGPT's default until 2026-11-26), which the exported model must index at each row's own positions.
EXPORTABLE = [a for a in registry.ARCHITECTURES if a != "gpt+cos"] + ["angpt-dense"]
OVERRIDES = {"angpt-dense": ("angpt", {"nu_att": "dense"})}


def trained(name, tok):
    """A tiny model after 30 Adam steps on TEXT, at a context that holds the long prompts and 80 new tokens."""
    arch, overrides = OVERRIDES.get(name, (name, {}))
    return export_tests.trained(arch, tok, steps=30, text=TEXT * 8, window=64, context_length=CONTEXT, **overrides)


@pytest.fixture(scope="module")
def exported(tok, tmp_path_factory):
    root = tmp_path_factory.mktemp("gen-exports")
    out = {}
    for arch in EXPORTABLE:
        model = trained(arch, tok)
        path = export_hf(model, root / arch.replace("+", "plus"), tok)
        out[arch] = (model, transformers.AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval())
    return out


def prompts(tok):
    """Two prompts of different lengths (100 and 61 tokens), the shorter one left-padded, and its mask."""
    data = tok.encode(TEXT * 2)
    long, short = data[3:103], data[40:101]
    pad = len(long) - len(short)
    x = torch.tensor([[tok.eos_id] * pad + short, long])
    mask = torch.tensor([[0] * pad + [1] * len(short), [1] * len(long)])
    return x, mask, short, long


def hf_greedy(hf, x, mask=None, use_cache=True):
    out = hf.generate(
        x, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, use_cache=use_cache
    )
    return out[:, x.shape[1] :]


@pytest.mark.parametrize("arch", EXPORTABLE)
def test_cached_generation_equals_uncached_and_ours(exported, tok, arch):
    model, hf = exported[arch]
    x, mask, short, long = prompts(tok)
    with torch.no_grad():
        cached = hf_greedy(hf, x, mask)
        assert cached.shape == (2, NEW)
        assert torch.equal(cached, hf_greedy(hf, x, mask, use_cache=False))
        ours = generate(model, x, max_new_tokens=NEW, temperature=0, attention_mask=mask)[:, x.shape[1] :]
        assert torch.equal(cached, ours)
        # each row, alone and unpadded, generates what it generated in the left-padded batch
        assert torch.equal(hf_greedy(hf, torch.tensor([short]))[0], cached[0])
        assert torch.equal(hf_greedy(hf, torch.tensor([long]))[0], cached[1])


@pytest.mark.parametrize("arch", EXPORTABLE)
def test_cached_logits_token_by_token_equal_full_forward(exported, tok, arch):
    """No `generate`: a prefill of 40 tokens, then one token per forward with the returned cache passed back (under
    both of its names), must give the full forward's logits at every position."""
    _, hf = exported[arch]
    x = torch.tensor([tok.encode(TEXT)[:120], tok.encode(TEXT)[50:170]])
    with torch.no_grad():
        full = hf(x, use_cache=False).logits
        out = hf(x[:, :40], use_cache=True)
        steps = [out.logits]
        cache = out[CACHE_FIELD]
        assert cache is not None and cache.get_seq_length() == 40
        for t in range(40, x.shape[1]):
            name = CACHE_FIELD if t % 2 else "past_key_values"  # the current name and the old one alike
            out = hf(x[:, t : t + 1], use_cache=True, **{name: cache})
            cache = out[CACHE_FIELD]
            steps.append(out.logits)
        cached = torch.cat(steps, dim=1)
    assert cache.get_seq_length() == x.shape[1]
    torch.testing.assert_close(cached, full, atol=2e-5, rtol=1e-4)


def test_scaled_cosine_attention_is_not_exportable(tok, tmp_path):
    model = angpt.build_model("gpt+cos", "tiny", vocab_size=tok.vocab_size)
    with pytest.raises(UserError, match="gpt\\+cos|cosine"):
        export_hf(model, tmp_path / "cos", tok)


def test_untested_transformers_warns_once_naming_the_range(monkeypatch):
    from angpt.hf import modeling_angpt as m

    low, high = m.TESTED_TRANSFORMERS
    monkeypatch.setattr(m, "_warned_untested", False)
    assert not m.warn_if_untested(low) and not m.warn_if_untested(high)  # the ends of the range are tested
    assert not m.warn_if_untested(high + "+local")
    with pytest.warns(UserWarning, match=f"{low} to {high}") as caught:
        assert m.warn_if_untested("99.0.0")
        assert not m.warn_if_untested("99.0.0")  # once per process
    assert len(caught) == 1
    monkeypatch.setattr(m, "_warned_untested", False)
    with pytest.warns(UserWarning, match="4.50.3 is outside"):
        m.warn_if_untested("4.50.3")  # below the floor too
    # loading a model runs the check with the installed version
    monkeypatch.setattr(m, "_warned_untested", False)
    monkeypatch.setattr(m.transformers, "__version__", "99.0.0")
    with pytest.warns(UserWarning, match="99.0.0"):
        m.AngptFoldedForCausalLM(m.AngptFoldedConfig())


def test_installed_transformers_is_within_the_tested_range():
    """The pinned install (constraints.txt) must be one the compat matrix ran, or every user sees the warning."""
    from angpt.hf import modeling_angpt as m

    low, high = m.TESTED_TRANSFORMERS
    assert m._release(low) <= m._release(transformers.__version__) <= m._release(high)

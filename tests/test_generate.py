"""Generation: KV cache == full recompute, seeded sampling, left-padded batches == single prompts, streaming."""

import pytest
import torch

import angpt
from angpt.errors import UserError
from angpt.infer import IncrementalDecoder, generate, generate_batch, sample_stream
from angpt.infer.generate import forward_hidden, pick_tokens

# every registered architecture, and anGPT with the paper's per-position attention factor nu_att[t] (its default until
# 2026-11-26), which a left-padded row must read at its own positions
ARCHS = [*angpt.ARCHS, "angpt-dense"]
OVERRIDES = {"angpt-dense": ("angpt", {"nu_att": "dense"})}
STEPS = 60
TEXT = (
    "The quick brown fox jumps over the lazy dog. A stitch in time saves nine. "
    "All that glitters is not gold. Where there is smoke there is fire. "
)
PROMPTS = ["The quick", "All that glitters", "A", "", "Where there is smoke there"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def models(tok):
    """Each architecture (tiny, bytes vocabulary) after STEPS Adam steps on TEXT, so that logits are not flat."""
    data = torch.tensor(tok.encode(TEXT * 3))
    out = {}
    for name in ARCHS:
        arch, overrides = OVERRIDES.get(name, (name, {}))
        torch.manual_seed(0)
        model = angpt.build_model(arch, "tiny", vocab_size=tok.vocab_size, **overrides)
        opt, _ = angpt.make_optimizer(model, lr=1e-2, max_steps=STEPS)
        angpt.attach_constraints(model, opt)
        gen = torch.Generator().manual_seed(0)
        for _ in range(STEPS):
            starts = torch.randint(0, len(data) - 33, (8,), generator=gen)
            batch = torch.stack([data[s : s + 33] for s in starts])
            _, loss = model(batch[:, :-1], batch[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad()
        out[name] = model.eval()
    return out


def prompt_batch(tok, n=3, length=12):
    ids = torch.tensor(tok.encode(TEXT))
    return torch.stack([ids[i * 7 : i * 7 + length] for i in range(n)])


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_cache_equals_full_recompute(models, tok, arch):
    model = models[arch]
    x = prompt_batch(tok)
    cached = generate(model, x, max_new_tokens=24, temperature=0)
    full = generate(model, x, max_new_tokens=24, temperature=0, use_cache=False)
    assert cached.shape == (3, 12 + 24)
    assert torch.equal(cached[:, :12], x)
    assert torch.equal(cached, full)
    if arch in ("ngpt", "angpt", "angpt-dense"):  # the folded inference model through the same cache path
        folded = angpt.fold_for_inference(model)
        assert torch.equal(
            generate(folded, x, max_new_tokens=24, temperature=0),
            generate(folded, x, max_new_tokens=24, temperature=0, use_cache=False),
        )


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_logits_equal_full_forward(models, tok, arch):
    model = models[arch]
    x = torch.tensor([tok.encode(TEXT[:40])])
    with torch.no_grad():
        full = model(x)[0]
        cache = model.make_cache(1, 40)
        steps = [model.logits(forward_hidden(model, x[:, :25], cache=cache))]
        for t in range(25, 40):
            steps.append(model.logits(forward_hidden(model, x[:, t : t + 1], cache=cache)))
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
    with torch.no_grad():  # forward_hidden is the model's own forward without the head
        cache, own = model.make_cache(1, 40), model.make_cache(1, 40)
        assert torch.equal(model.logits(forward_hidden(model, x, cache=cache)), model(x, cache=own)[0])


@pytest.mark.parametrize("arch", ["gpt+", "angpt"])
def test_seeded_sampling_is_reproducible(models, tok, arch):
    model = models[arch]
    x = prompt_batch(tok)
    kw = dict(max_new_tokens=20, temperature=1.0, top_k=50, top_p=0.95)
    a = generate(model, x, seed=7, **kw)
    assert torch.equal(a, generate(model, x, seed=7, **kw))
    assert torch.equal(a, generate(model, x, seed=7, use_cache=False, **kw))  # same draws, same logits
    assert not torch.equal(a, generate(model, x, seed=8, **kw))
    greedy = generate(model, x, max_new_tokens=20, temperature=0)
    assert torch.equal(generate(model, x, max_new_tokens=20, top_k=1, seed=1), greedy)
    assert torch.equal(generate(model, x, max_new_tokens=20, top_p=1e-6, seed=1), greedy)
    texts = generate_batch(model, tok, PROMPTS, max_new_tokens=10, seed=3)
    assert texts == generate_batch(model, tok, PROMPTS, max_new_tokens=10, seed=3)


def test_top_k_top_p_cuts():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]]).repeat(4000, 1)
    gen = torch.Generator().manual_seed(0)
    assert set(pick_tokens(logits, 1.0, top_k=2, generator=gen).tolist()) == {0, 1}
    # softmax mass: 0.64, 0.23, 0.09, ...; top_p=0.8 keeps the first two (0.64 < 0.8 before the second)
    assert set(pick_tokens(logits, 1.0, top_p=0.8, generator=gen).tolist()) == {0, 1}
    assert torch.equal(pick_tokens(logits[:2], 0.0), torch.tensor([0, 0]))


@pytest.mark.parametrize("arch", ARCHS)
def test_left_padded_batch_equals_single_prompts(models, tok, arch):
    model = models[arch]
    batched = generate_batch(model, tok, PROMPTS, max_new_tokens=24, temperature=0)
    single = [generate_batch(model, tok, [p], max_new_tokens=24, temperature=0)[0] for p in PROMPTS]
    assert batched == single
    assert len(set(batched)) > 1  # not a degenerate model that says the same thing to everyone
    assert generate_batch(model, tok, PROMPTS, max_new_tokens=24, temperature=0, batch_size=2) == single
    assert generate_batch(model, tok, PROMPTS, max_new_tokens=24, temperature=0, use_cache=False) == single


@pytest.mark.parametrize("arch", ARCHS)
def test_left_padded_logits_equal_single_prompt_logits(models, tok, arch):
    model = models[arch]
    short, long = tok.encode("glitters is"), tok.encode("All that glitters is")
    pad = len(long) - len(short)
    ids = torch.tensor([[0] * pad + short, long])
    mask = torch.tensor([[False] * pad + [True] * len(short), [True] * len(long)])
    with torch.no_grad():
        cache = model.make_cache(2, len(long))
        cache.key_mask = mask
        padded = model.logits(forward_hidden(model, ids, cache=cache, offsets=torch.tensor([pad, 0])))
        alone = model(torch.tensor([short]))[0]
    assert torch.allclose(padded[0, pad:], alone[0], atol=1e-5)


def test_angpt_needs_per_row_positions(models, tok):
    """Why generation shifts padded rows' positions: RoPE alone is shift invariant, but nGPT's and anGPT's learned
    per-dimension s_qk multiplies q and k after the rotation (so their logits are not a function of the relative
    position only), and anGPT's nu_att[t] under `dense` depends on the position itself."""
    short, long = tok.encode("glitters is"), tok.encode("All that glitters is")
    pad = len(long) - len(short)
    ids = torch.tensor([[0] * pad + short, long])
    mask = torch.tensor([[False] * pad + [True] * len(short), [True] * len(long)])
    for arch, shift_matters in [("angpt", True), ("ngpt", True), ("gpt+", False)]:
        model = models[arch]
        with torch.no_grad():
            cache = model.make_cache(2, len(long))
            cache.key_mask = mask
            unshifted = model(ids, cache=cache)[0]  # padding masked, positions not shifted
            alone = model(torch.tensor([short]))[0]
        close = torch.allclose(unshifted[0, pad:], alone[0], atol=1e-4)
        assert close != shift_matters, arch


def test_stream_callback_sees_every_step(models, tok):
    x = prompt_batch(tok)
    seen = []
    out = generate(models["ngpt"], x, max_new_tokens=9, temperature=0, stream=lambda t: seen.append(t.clone()))
    assert torch.equal(torch.stack(seen, dim=1), out[:, 12:])


def test_stop_ids_eos_and_stop_strings(models, tok):
    model = models["gpt+"]
    x = prompt_batch(tok, n=1)
    greedy = generate(model, x, max_new_tokens=20, temperature=0)
    first = int(greedy[0, 12])
    stopped = generate(model, x, max_new_tokens=20, temperature=0, stop_ids=[first])
    assert stopped.shape == (1, 13) and int(stopped[0, -1]) == first
    # a row that finishes early is padded while the other row goes on (until it finishes too)
    two = prompt_batch(tok, n=2)
    free = generate(model, two, max_new_tokens=20, temperature=0)
    eos = int(free[0, 12])
    out = generate(model, two, max_new_tokens=20, temperature=0, eos_id=eos, pad_id=255)
    row1 = free[1, 12:].tolist()
    steps = row1.index(eos) + 1 if eos in row1 else 20
    assert out.shape == (2, 12 + steps)
    assert int(out[0, 12]) == eos and out[0, 13:].eq(255).all()
    assert out[1, 12:].tolist() == row1[:steps]
    full = generate_batch(model, tok, ["The quick"], max_new_tokens=30, temperature=0)[0]
    stop = full[5:8]
    cut = generate_batch(model, tok, ["The quick"], max_new_tokens=30, temperature=0, stop=[stop])[0]
    assert cut == full[: full.find(stop)]


def test_sample_stream_matches_generate_batch(models, tok):
    model = models["angpt"]
    for prompt in PROMPTS:
        pieces = list(sample_stream(model, tok, prompt, max_new_tokens=24, temperature=0))
        assert "".join(pieces) == generate_batch(model, tok, [prompt], max_new_tokens=24, temperature=0)[0]
    full = generate_batch(model, tok, ["The quick"], max_new_tokens=30, temperature=0)[0]
    stop = full[6:9]
    streamed = "".join(sample_stream(model, tok, "The quick", max_new_tokens=30, temperature=0, stop=[stop]))
    assert streamed == full[: full.find(stop)]


def test_incremental_decoder_never_splits_utf8(tok):
    text = "héllo wörld € 😀 done"
    dec = IncrementalDecoder(tok)
    pieces = [dec.push([b]) for b in tok.encode(text)]
    pieces.append(dec.flush())
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[tok.encode(text).index(0xE2)] == ""  # first byte of the 3-byte euro sign: held back


def test_context_length_errors(models, tok):
    model = models["angpt"]  # tiny: context length 64
    with pytest.raises(UserError, match="longer than the model's context length 64"):
        generate(model, torch.zeros(1, 65, dtype=torch.long), max_new_tokens=1)
    with pytest.raises(UserError, match="max_new_tokens <= 14"):
        generate(model, torch.zeros(1, 50, dtype=torch.long), max_new_tokens=20)
    assert generate(model, torch.zeros(1, 50, dtype=torch.long), max_new_tokens=14, temperature=0).shape == (1, 64)
    with pytest.raises(UserError, match="longer than the model's context length"):
        generate_batch(model, tok, ["x" * 100], max_new_tokens=1)
    with pytest.raises(UserError, match="left padding"):
        generate(
            model,
            torch.zeros(2, 4, dtype=torch.long),
            max_new_tokens=1,
            attention_mask=torch.tensor([[1] * 4, [1, 1, 0, 0]]),
        )
    with pytest.raises(UserError, match="temperature"):
        generate(model, torch.zeros(1, 4, dtype=torch.long), max_new_tokens=1, temperature=-1)

"""Autoregressive generation for every architecture (GPT, GPT+, nGPT, anGPT, and folded models), with a KV cache.

The core is :func:`iter_tokens`, a generator that yields one token per row per step; :func:`generate` collects
them into a tensor, :func:`generate_batch` runs text prompts in left-padded batches, :func:`sample_stream` yields
decoded text as it is produced.

Left padding and positions. A left-padded row's real tokens sit at shifted absolute positions. Attention only
needs the padding keys masked (the KV cache's `key_mask`), and RoPE is relative in exact arithmetic, but nGPT and
anGPT scale q and k per dimension by a learned `s_qk` after the rotation (so their logits depend on more than the
relative position), and anGPT with `nu_att: dense` multiplies attention outputs by a per-position factor
`nu_att[t]`. So a padded row is run at its own positions: position = absolute index - (row's padding), for RoPE and
`nu_att` alike. Then every
row computes what it would compute alone, and batched greedy generation equals per-prompt generation.
The KV cache carries the per-row padding (`KVCache.offsets`) to the blocks.

Context length rule: every row's prompt length + `max_new_tokens` must fit in the model's context length, and a
longer request is a UserError that says how many new tokens fit (a prompt longer than the context always is).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from angpt.errors import UserError
from angpt.models.constraints import unwrap
from angpt.models.layers import KVCache

StopFn = Callable[[int, list[int]], bool]
StreamFn = Callable[[torch.Tensor], None]


# ------------------------------------------------------------------------------------ per-row positions
def forward_hidden(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    *,
    cache: KVCache | None = None,
    offsets: torch.Tensor | None = None,
) -> torch.Tensor:
    """Final hidden states [B, T, d] of an angpt `LanguageModel` (apply `model.logits` to the positions you need).

    `offsets` [B] is the left padding of each row, whose positions then start at 0 after its padding (the padding
    keys must be masked through `cache.key_mask`); it needs the cache, which carries it and advances by T.
    """
    if offsets is not None:
        if cache is None:
            raise ValueError("per-row offsets need a KV cache to carry them")
        cache.offsets = offsets
    return unwrap(model).hidden(input_ids, cache)


# --------------------------------------------------------------------------------------------- sampling
def _check_sampling(temperature: float, top_k: int | None, top_p: float | None, max_new_tokens: int) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise UserError(f"max_new_tokens={max_new_tokens!r} must be a non-negative integer")
    if not temperature >= 0:
        raise UserError(f"temperature={temperature!r} must be >= 0 (0 = greedy)")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise UserError(f"top_k={top_k!r} must be a positive integer (or None for no top-k cut)")
    if top_p is not None and not 0 < top_p <= 1:
        raise UserError(f"top_p={top_p!r} must be in (0, 1] (or None for no nucleus cut)")


def pick_tokens(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token per row from logits [B, V]: argmax at temperature 0, else a sample after top-k / top-p cuts."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the mass before it already reaches top_p; the most likely token always stays.
        drop = probs.cumsum(-1) - probs >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


# ------------------------------------------------------------------------------------------- generation
def _left_padding(
    attention_mask: torch.Tensor | None, B: int, T: int, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """(offsets [B] or None when nothing is padded, real lengths [B], boolean mask or None)."""
    if attention_mask is None:
        return None, torch.full((B,), T, device=device), None
    mask = torch.as_tensor(attention_mask, device=device).bool()
    if mask.shape != (B, T):
        raise UserError(f"attention_mask has shape {tuple(mask.shape)}, expected {(B, T)} like input_ids")
    lengths = mask.sum(1)
    if bool((lengths == 0).any()):
        raise UserError("every row of attention_mask needs at least one token (a 1)")
    expected = torch.arange(T, device=device)[None] >= (T - lengths)[:, None]
    if not torch.equal(mask, expected):
        raise UserError("attention_mask must describe left padding: in each row, zeros (padding) then ones")
    offsets = T - lengths
    if int(offsets.max()) == 0:
        return None, lengths, None
    return offsets, lengths, mask


def _check_budget(longest: int, max_new_tokens: int, context: int) -> None:
    if longest > context:
        raise UserError(
            f"prompt of {longest} tokens is longer than the model's context length {context}; shorten the prompt"
        )
    if longest + max_new_tokens > context:
        raise UserError(
            f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds the context length {context}; "
            f"use max_new_tokens <= {context - longest} or a shorter prompt"
        )


def iter_tokens(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    stop_ids: Iterable[int] | None = None,
    stop: StopFn | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    attention_mask: torch.Tensor | None = None,
    pad_id: int | None = None,
    compile: bool | str = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield `(tokens [B], finished [B])` once per generated position; see :func:`generate` for the arguments.

    `finished[b]` is True once row b has produced `eos_id`, one of `stop_ids`, or `stop(b, new_ids)` returned
    True (that token is part of the output); later tokens of a finished row are `pad_id`. Stops early when
    every row is finished.
    """
    base = unwrap(model)
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise UserError(f"input_ids must be a [batch, length] tensor with length >= 1, got {tuple(input_ids.shape)}")
    _check_sampling(temperature, top_k, top_p, max_new_tokens)
    device = next(base.parameters()).device
    ids = input_ids.to(device=device, dtype=torch.long)
    B, T = ids.shape
    offsets, lengths, mask = _left_padding(attention_mask, B, T, device)
    _check_budget(int(lengths.max()), max_new_tokens, base.config.context_length)
    if max_new_tokens == 0:
        return
    if generator is None and seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    enders = set(stop_ids or ()) | ({eos_id} if eos_id is not None else set())
    pad = pad_id if pad_id is not None else (eos_id if eos_id is not None else 0)
    new: list[list[int]] = [[] for _ in range(B)]
    done = torch.zeros(B, dtype=torch.bool, device=device)
    decode = _decode_step
    if compile and use_cache:  # the one-token step; after a first specialisation its cache position goes dynamic
        decode = torch.compile(_decode_step, backend="inductor" if compile is True else compile)

    with torch.inference_mode():
        if use_cache:
            cache = base.make_cache(B, T + max_new_tokens)
            if mask is not None:
                cache.key_mask = torch.ones(B, T + max_new_tokens, dtype=torch.bool, device=device)
                cache.key_mask[:, :T] = mask
            logits = base.logits(forward_hidden(base, ids, cache=cache, offsets=offsets)[:, -1:])[:, -1]
        else:
            seq = ids
            logits = _full_logits(base, seq, offsets)
    for step in range(max_new_tokens):
        with torch.inference_mode():
            tok = pick_tokens(logits, temperature, top_k, top_p, generator)
            tok = torch.where(done, torch.full_like(tok, pad), tok)
        finished = done.clone()
        for b, t in enumerate(tok.tolist()):
            if finished[b]:
                continue
            new[b].append(t)
            if t in enders or (stop is not None and stop(b, new[b])):
                finished[b] = True
        yield tok, finished
        done = finished
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        with torch.inference_mode():
            if use_cache:
                logits = decode(base, tok[:, None], cache, offsets)
            else:
                seq = torch.cat([seq, tok[:, None]], dim=1)
                logits = _full_logits(base, seq, offsets)


def _decode_step(base, tok: torch.Tensor, cache: KVCache, offsets: torch.Tensor | None) -> torch.Tensor:
    """Last-position logits of one decoding step through the KV cache."""
    return base.logits(forward_hidden(base, tok, cache=cache, offsets=offsets))[:, -1]


def _full_logits(model: torch.nn.Module, seq: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
    """The reference path: last-position logits from a full forward over each sequence (no cache).

    Padded rows run one at a time without their padding, which is what "this prompt alone" means.
    """
    if offsets is None:
        return model(seq)[0][:, -1]
    return torch.cat([model(seq[b : b + 1, int(o) :])[0][:, -1] for b, o in enumerate(offsets.tolist())])


def generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    stream: StreamFn | None = None,
    **options: Any,
) -> torch.Tensor:
    """Extend each row of `input_ids` [B, T] by up to `max_new_tokens` tokens; returns [B, T + steps].

    `options` are :func:`iter_tokens`' keywords (temperature, top_k, top_p, eos_id, stop_ids, stop, seed,
    generator, use_cache, attention_mask, pad_id):

    - `temperature` 0 is greedy; otherwise tokens are sampled from softmax(logits / temperature) after the
      optional `top_k` and nucleus `top_p` cuts. `seed` (or a `generator`) makes sampling reproducible.
    - A row finishes at `eos_id`, at any of `stop_ids`, or when `stop(row, new_ids)` returns True (e.g. a stop
      string, see :func:`generate_batch`); the finishing token is kept and later positions hold `pad_id`
      (default `eos_id`, else 0). Generation ends early once every row has finished, so steps <= max_new_tokens.
    - `attention_mask` [B, T] (1 = token, 0 = padding) describes LEFT padding; each row then computes exactly
      what it would compute alone (see the module docstring).
    - `use_cache=False` recomputes the whole prefix at every step (the reference path).
    - `compile=True` compiles the cached decoding step with torch.compile (or names its backend); it compiles
      twice at most (the first step, then once with the cache position dynamic), not at every step.
    - `stream(tokens)` is called after every step with that step's tokens [B].

    Raises UserError when a prompt + max_new_tokens does not fit the context length.
    """
    steps = []
    for tok, _ in iter_tokens(model, input_ids, max_new_tokens=max_new_tokens, **options):
        steps.append(tok)
        if stream is not None:
            stream(tok)
    ids = input_ids.to(device=steps[0].device if steps else input_ids.device, dtype=torch.long)
    return torch.cat([ids, torch.stack(steps, dim=1)], dim=1) if steps else ids


# -------------------------------------------------------------------------------------------- text helpers
def _cut_at_stop(text: str, stop: Sequence[str] | None) -> tuple[str, bool]:
    """`text` up to the earliest stop string (excluded), and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop or ()) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def _encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    # An empty prompt starts a new document: EOS is what precedes every document in the training data.
    return list(tokenizer.encode(prompt)) or [tokenizer.eos_id]


def generate_ids_batch(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop: Sequence[str] | None = None,
    batch_size: int | None = None,
    seed: int | None = None,
    **kwargs: Any,
) -> list[str]:
    """Like :func:`generate_batch`, for prompts that are already token ids (non-empty lists)."""
    if batch_size is not None and batch_size < 1:
        raise UserError(f"batch_size={batch_size!r} must be a positive integer (or None for one batch)")
    stop = [s for s in (stop or ()) if s]
    device = next(unwrap(model).parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    eos = tokenizer.eos_id
    # Longest first, so each batch holds similar lengths (little padding) and a too-long prompt fails first.
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    size = batch_size or max(1, len(order))
    out: list[str] = [""] * len(prompts)
    for lo in range(0, len(order), size):
        rows = order[lo : lo + size]
        T = max(len(prompts[i]) for i in rows)
        ids = torch.full((len(rows), T), eos, dtype=torch.long)
        mask = torch.zeros((len(rows), T), dtype=torch.long)
        for r, i in enumerate(rows):
            p = list(prompts[i])
            if not p:
                raise UserError("a prompt has no tokens; pass at least one token id per prompt")
            ids[r, T - len(p) :] = torch.tensor(p)
            mask[r, T - len(p) :] = 1

        def stop_fn(row: int, new_ids: list[int]) -> bool:
            return _cut_at_stop(tokenizer.decode(new_ids), stop)[1]

        result = generate(
            model,
            ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            eos_id=eos,
            stop=stop_fn if stop else None,
            generator=generator,
            **kwargs,
        )
        for r, i in enumerate(rows):
            new = result[r, T:].tolist()
            if eos in new:
                new = new[: new.index(eos)]
            out[i] = _cut_at_stop(tokenizer.decode(new), stop)[0]
    return out


def generate_batch(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop: Sequence[str] | None = None,
    seed: int | None = None,
    use_cache: bool = True,
    batch_size: int | None = None,
) -> list[str]:
    """Generate a continuation of each text prompt; returns the new text only, in the order of `prompts`.

    Prompts are tokenized with `tokenizer` (an angpt Tokenizer: `.encode`, `.decode`, `.eos_id`; an empty prompt
    becomes [EOS]), sorted by length and run in LEFT-padded batches of `batch_size` (None: all at once). Each
    continuation ends before EOS and before the first of the `stop` strings (generation of a row stops as soon
    as its text contains one). With `seed`, sampling is reproducible for the same prompts and batch size.
    """
    ids = [_encode_prompt(tokenizer, p) for p in prompts]
    return generate_ids_batch(
        model,
        tokenizer,
        ids,
        max_new_tokens=max_new_tokens,
        stop=stop,
        batch_size=batch_size,
        seed=seed,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        use_cache=use_cache,
    )


class IncrementalDecoder:
    """Turns a growing list of token ids into text pieces without ever emitting half a UTF-8 character.

    Byte-level tokens can end inside a multi-byte character; the decoder then renders U+FFFD at the end, so a
    piece is only released once the text decodes cleanly. Each call decodes a short window (the previous piece
    plus the new tokens), so tokenizers whose pieces depend on their neighbours (leading spaces) also come out
    right, and the cost per token stays constant.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # start of the window: the tokens of the previously released piece
        self._read = 0  # tokens up to here have been released as text

    def push(self, ids: Iterable[int]) -> str:
        """Add token ids; return the newly complete text (possibly empty)."""
        self.ids.extend(int(i) for i in ids)
        before = self.tokenizer.decode(self.ids[self._prefix : self._read])
        text = self.tokenizer.decode(self.ids[self._prefix :])
        if len(text) > len(before) and not text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return text[len(before) :]
        return ""

    def flush(self) -> str:
        """Whatever is left, incomplete characters rendered as U+FFFD."""
        before = self.tokenizer.decode(self.ids[self._prefix : self._read])
        text = self.tokenizer.decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return text[len(before) :]


def sample_stream(
    model: torch.nn.Module,
    tokenizer: Any,
    prompt: str,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop: Sequence[str] | None = None,
    seed: int | None = None,
    use_cache: bool = True,
    compile: bool | str = False,
) -> Iterator[str]:
    """Yield the continuation of `prompt` as text pieces while it is generated (for printing as it goes).

    The pieces concatenate to what :func:`generate_batch` returns for the same arguments: no EOS text, no
    partial UTF-8 characters, and the text ends before the first `stop` string (text that might be the start
    of a stop string is held back until it is not).
    """
    stop = [s for s in (stop or ()) if s]
    hold = max((len(s) for s in stop), default=1) - 1
    decoder = IncrementalDecoder(tokenizer)
    text, sent = "", 0
    ids = torch.tensor([_encode_prompt(tokenizer, prompt)])
    tokens = iter_tokens(
        model,
        ids,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_id=tokenizer.eos_id,
        seed=seed,
        use_cache=use_cache,
        compile=compile,
    )
    try:
        for tok, _ in tokens:
            t = int(tok[0])
            if t == tokenizer.eos_id:
                break
            text += decoder.push([t])
            cut, found = _cut_at_stop(text, stop)
            if found:
                if len(cut) > sent:
                    yield cut[sent:]
                return
            if len(text) - hold > sent:
                yield text[sent : len(text) - hold]
                sent = len(text) - hold
        text += decoder.flush()
        text = _cut_at_stop(text, stop)[0]
        if len(text) > sent:
            yield text[sent:]
    finally:
        tokens.close()

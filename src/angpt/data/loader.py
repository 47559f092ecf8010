"""Batches of token windows for training and evaluation, with exact resume and data-parallel ranks.

Windows: each shard's tokens are cut into non-overlapping windows of ``seq_len`` inputs; window ``i`` of a
shard reads tokens ``[i*seq_len, (i+1)*seq_len + 1)`` so its targets are its inputs shifted by one (the last
target is the next window's first input). Windows never cross shard boundaries, and the few tokens left at the
end of a shard are not used. Window ids number all windows of a split, shard by shard.

Training order: a single global stream of window ids, epoch after epoch; epoch ``e`` is a permutation of all
windows drawn from ``(seed, e)`` (or the identity with ``shuffle=False``). Every ``next_batch()`` call on every
rank consumes the next ``world_size * batch_size`` ids of the stream and rank ``r`` takes the contiguous slice
``[r*batch_size, (r+1)*batch_size)``. Hence

* concatenating the ranks' batches of one call gives exactly the batch a single process with
  ``batch_size * world_size`` reads at that call, and
* with gradient accumulation, the windows of one optimizer step (``accum`` calls) are stream positions
  ``[p, p + world_size * batch_size * accum)`` whatever the split into ranks, micro-batches and accumulation,
  so runs with the same global batch see the same data per step.

The cursor is one global stream position, independent of rank and world size, so a checkpoint can be resumed
with a different number of ranks as long as the global batch stays the same.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import torch

from angpt.data.format import check_token_ids, load_meta, open_shard, read_shard_header, split_files
from angpt.errors import DataError


class _Windows:
    """The windows of one split: memory-mapped shards plus the window-id -> (shard, offset) mapping."""

    def __init__(
        self,
        data_dir: str | os.PathLike,
        split: str,
        seq_len: int,
        *,
        allow_empty: bool = False,
        meta: dict | None = None,
    ):
        if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
            raise DataError(f"seq_len must be a positive integer, got {seq_len!r}")
        self.meta = meta if meta is not None else load_meta(data_dir)
        self.seq_len = seq_len
        self.shards = []
        vocab_size = int(self.meta["vocab_size"])
        for path, count in split_files(data_dir, self.meta, split):
            header = read_shard_header(path)
            if (
                header["count"] != count
                or header["tokenizer_hash"] != self.meta["tokenizer_hash"][:32]
                or header["vocab_size"] != vocab_size
            ):
                raise DataError(f"{path} does not match {data_dir}/meta.json; prepare the dataset again")
            tokens = open_shard(path)
            check_token_ids(path, tokens, vocab_size)  # once per shard file: a corrupt id fails here, not in a step
            self.shards.append(tokens.view(np.ndarray))  # plain views: memmap slicing is slow
        self.tokens = sum(len(s) for s in self.shards)
        counts = [max(0, (len(s) - 1) // seq_len) for s in self.shards]
        self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self.count = int(self.starts[-1])
        if self.count == 0 and not allow_empty:
            tokens = sum(len(s) for s in self.shards)
            raise DataError(
                f"the {split} split of {data_dir} has {tokens} tokens, fewer than seq_len+1={seq_len + 1}; "
                "use a shorter seq_len or more data (or a larger val_fraction for val)"
            )

    def gather(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets (int64, ``[len(ids), seq_len]``) of the windows ``ids``."""
        L = self.seq_len
        shard = np.searchsorted(self.starts, ids, side="right") - 1
        offset = (ids - self.starts[shard]) * L
        x = torch.empty((len(ids), L), dtype=torch.int64)
        y = torch.empty((len(ids), L), dtype=torch.int64)
        xn, yn = x.numpy(), y.numpy()  # fill the tensors in place: one slice copy per window, no temporaries
        for row, (s, o) in enumerate(zip(shard.tolist(), offset.tolist())):
            window = self.shards[s][o : o + L + 1]
            xn[row] = window[:-1]
            yn[row] = window[1:]
        return x, y


class TokenLoader:
    """Infinite, resumable source of training batches ``(x, y)``; see the module docstring for the order.

    Args:
        data_dir: a prepared dataset folder.
        split: ``"train"`` or ``"val"``.
        batch_size: windows per call on this rank (the micro-batch).
        seq_len: tokens per window.
        rank, world_size: this process's data-parallel rank and the number of ranks.
        seed: seeds the per-epoch permutations.
        shuffle: permute windows each epoch (else read them in order).
        meta: the dataset's meta.json, where the caller has read it already.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike,
        split: str,
        batch_size: int,
        seq_len: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        meta: dict | None = None,
    ):
        _check_ranks(batch_size, rank, world_size)
        self.data_dir = str(data_dir)
        self.split = split
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.rank = rank
        self.world_size = world_size
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self._windows = _Windows(data_dir, split, seq_len, meta=meta)
        self.meta = self._windows.meta
        self.num_windows = self._windows.count
        self._position = 0  # global stream position: windows consumed by all ranks together
        self._order_epoch = -1
        self._order: np.ndarray | None = None

    @property
    def epoch(self) -> int:
        """The epoch the next batch starts in (0-based)."""
        return self._position // self.num_windows

    @property
    def tokens_per_epoch(self) -> int:
        """Input tokens in one pass over all windows."""
        return self.num_windows * self.seq_len

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if epoch != self._order_epoch:
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, epoch]).permutation(self.num_windows)
            else:
                self._order = np.arange(self.num_windows)
            self._order_epoch = epoch
        return self._order

    def _stream(self, start: int, count: int) -> np.ndarray:
        """Window ids at global stream positions ``[start, start + count)``, across epoch boundaries."""
        parts, n = [], self.num_windows
        while count > 0:
            epoch, pos = divmod(start, n)
            take = min(count, n - pos)
            parts.append(self._epoch_order(epoch)[pos : pos + take])
            start, count = start + take, count - take
        return np.concatenate(parts)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's next ``(x, y)``, int64 ``[batch_size, seq_len]``, ``y`` being ``x`` shifted by one."""
        ids = self._stream(self._position + self.rank * self.batch_size, self.batch_size)
        self._position += self.world_size * self.batch_size
        return self._windows.gather(ids)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next_batch()

    def state_dict(self) -> dict:
        """The cursor as JSON-serialisable ints; the same for every rank."""
        epoch, position = divmod(self._position, self.num_windows)
        return {
            "epoch": epoch,
            "position": position,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "num_windows": self.num_windows,
            "shuffle": int(self.shuffle),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly after the batches read before ``state_dict()`` was taken."""
        try:
            epoch, position = int(state["epoch"]), int(state["position"])
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"bad data loader state {state!r}: it needs integer 'epoch' and 'position'") from e
        mine_all = {"seq_len": self.seq_len, "num_windows": self.num_windows, "seed": self.seed}
        mine_all["shuffle"] = int(self.shuffle)
        for key, mine in mine_all.items():
            if key in state and int(state[key]) != mine:
                raise DataError(
                    f"data loader state has {key}={state[key]} but this loader has {key}={mine}; "
                    "resume with the same dataset, seq_len, data seed and shuffle"
                )
        if epoch < 0 or not 0 <= position < self.num_windows:
            raise DataError(f"data loader state position {position} is outside 0..{self.num_windows - 1}")
        self._position = epoch * self.num_windows + position


def iter_eval_batches(
    data_dir: str | os.PathLike,
    batch_size: int,
    seq_len: int,
    max_batches: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    *,
    split: str = "val",
    meta: dict | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Deterministic evaluation batches ``(x, y)`` over ``split``, the same on every call.

    The windows evaluated are the whole split, in order, or, when ``max_batches`` global batches hold fewer, that
    many windows evenly spaced over the whole split (so every part of it, every document's neighbourhood, is in
    the sample, not only its first documents). They come in global batches of ``world_size * batch_size``, rank
    ``r`` taking slice ``r``; after the full batches comes one smaller batch of ``(remaining // world_size)``
    windows per rank, so every rank yields the same number of equally shaped batches (with several ranks at most
    ``world_size - 1`` windows are skipped). Weight losses by batch size when averaging. `meta`: the dataset's
    meta.json, where the caller has read it already.
    """
    _check_ranks(batch_size, rank, world_size)
    windows = _Windows(data_dir, split, seq_len, meta=meta)
    if windows.count < world_size:  # else no rank gets a batch and a mean over nothing reads as a zero loss
        raise DataError(
            f"the {split} split of {data_dir} has {windows.count} window(s) of seq_len+1={seq_len + 1} tokens, "
            f"fewer than world_size={world_size}; use a shorter seq_len, fewer ranks or more {split} data"
        )
    chosen = eval_windows(windows.count, batch_size * world_size, max_batches)
    pos = 0
    while pos < chosen.size:
        per_rank = min(batch_size, (chosen.size - pos) // world_size)
        if per_rank == 0:
            return
        start = pos + rank * per_rank
        yield windows.gather(chosen[start : start + per_rank])
        pos += per_rank * world_size


def eval_windows(count: int, global_batch: int, max_batches: int | None) -> np.ndarray:
    """The indices of the windows an evaluation covers: all `count`, or `max_batches * global_batch` of them
    evenly spaced over the split when that is fewer."""
    n = count if max_batches is None else min(count, max_batches * global_batch)
    if n == count:
        return np.arange(count)
    return np.unique(np.linspace(0, count - 1, n).round().astype(np.int64))


def _check_ranks(batch_size: int, rank: int, world_size: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise DataError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(world_size, int) or world_size < 1 or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise DataError(f"need 0 <= rank < world_size, got rank={rank!r}, world_size={world_size!r}")


def check_trainable(
    data_dir: str | os.PathLike, seq_len: int, *, world_size: int = 1, meta: dict | None = None
) -> dict:
    """Check before step 1 that training on ``data_dir`` at ``seq_len`` can run and be evaluated.

    Raises a one-line DataError when the train split has no window of ``seq_len + 1`` tokens inside one shard,
    or the validation split is empty or has fewer such windows than ``world_size`` (one evaluation batch needs
    one window per rank), or a shard of either split is corrupt: a header that disagrees with ``meta.json`` or
    token ids outside the vocabulary (each shard is scanned once per process, so a TokenLoader opened after this
    does not scan again). Returns ``{"train_tokens", "train_windows", "val_tokens", "val_windows"}``.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise DataError(f"world_size must be a positive integer, got {world_size!r}")
    out = {}
    for split, label in (("train", "train"), ("val", "validation")):
        w = _Windows(data_dir, split, seq_len, allow_empty=True, meta=meta)
        where = f"the {label} split of {data_dir}"
        if split == "train" and w.count == 0:
            longest = max((len(s) for s in w.shards), default=0)
            raise DataError(
                f"{where} has {w.tokens} tokens (longest shard {longest}), no window of seq_len+1={seq_len + 1} "
                "tokens within a shard; use a shorter seq_len or prepare more data"
            )
        if split == "val" and w.tokens == 0:
            raise DataError(
                f"{where} is empty, so the run could never be evaluated; prepare it again with --val-fraction > 0 "
                "(and at least 2 documents)"
            )
        if split == "val" and w.count == 0:
            raise DataError(
                f"{where} has {w.tokens} tokens, fewer than seq_len+1={seq_len + 1} for one evaluation window; use "
                "a shorter seq_len, or prepare it again with a larger --val-fraction or more documents"
            )
        if split == "val" and w.count < world_size:
            raise DataError(
                f"{where} has {w.count} window(s) of seq_len+1={seq_len + 1} tokens, fewer than "
                f"world_size={world_size} (an evaluation batch takes one per rank); use a shorter seq_len, fewer "
                "ranks, or prepare it again with a larger --val-fraction"
            )
        out[f"{split}_tokens"], out[f"{split}_windows"] = w.tokens, w.count
    return out

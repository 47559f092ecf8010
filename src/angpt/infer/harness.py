"""lm-evaluation-harness adapter: angpt models as lm_eval model type ``angpt``, and :func:`evaluate_tasks`.

Importing this module imports lm_eval (the ``eval`` extra) and registers the model type, so that

    lm_eval.simple_evaluate(model="angpt", model_args="checkpoint=runs/demo/ckpt", tasks=[...])

works, as does ``AngptLM(model=..., tokenizer=...)`` for a model already in memory.

Scoring follows lm_eval's HF backend: the context is left-truncated so that context + continuation fits the
context length; rolling log-likelihoods use disjoint windows of the context length, each predicted from an
EOS-prefixed window (``lm_eval.utils.get_rolling_token_windows`` with context_len=1). Batches are sorted by
length and right-padded (causal attention: padding after a sequence cannot change it, and positions start at 0).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from angpt.errors import UserError
from angpt.infer.generate import forward_hidden, generate_ids_batch
from angpt.models.constraints import unwrap


def _batch_size(value: Any) -> int:
    if value in (None, "auto") or (isinstance(value, str) and value.startswith("auto")):
        return 16  # no memory probing on CPU; lm_eval's "auto" becomes a moderate fixed size
    try:
        size = int(value)
    except (TypeError, ValueError) as e:
        raise UserError(f"batch_size={value!r} must be a positive integer or 'auto'") from e
    if size < 1:
        raise UserError(f"batch_size={value!r} must be a positive integer or 'auto'")
    return size


@register_model("angpt")
class AngptLM(TemplateLM):
    """An angpt language model for lm_eval: log-likelihoods, rolling log-likelihoods and generation.

    Either `checkpoint` (a checkpoint or run folder, loaded with ``angpt.checkpoint.load_checkpoint_model``,
    tokenizer included) or `model` plus `tokenizer` (an angpt Tokenizer; or a spec / folder string to load one).
    `max_length` defaults to the model's context length; `max_gen_toks` is the default generation budget when a
    task does not set one. `device` moves the model there.
    """

    def __init__(
        self,
        checkpoint: str | None = None,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
        batch_size: int | str | None = 1,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        device: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if model is None:
            if checkpoint is None:
                raise UserError("the angpt lm_eval model needs model_args checkpoint=PATH")
            from angpt.checkpoint import load_checkpoint_model

            model, saved_tokenizer = load_checkpoint_model(checkpoint, device=device or "cpu")
            tokenizer = tokenizer if tokenizer is not None else saved_tokenizer
        if isinstance(tokenizer, (str, Path)):  # model_args tokenizer=SPEC_OR_PATH
            from angpt.data.tokenizer import load_tokenizer, make_tokenizer

            spec = str(tokenizer)
            tokenizer = make_tokenizer(spec) if spec == "bytes" or spec.startswith("hf:") else load_tokenizer(spec)
        if tokenizer is None:
            raise UserError(
                "AngptLM needs the model's tokenizer: the checkpoint has none, so pass tokenizer=PATH_OR_SPEC"
            )
        self.model = unwrap(model).eval()
        if device:
            self.model.to(device)
        self.tok = tokenizer
        self.batch_size = _batch_size(batch_size)
        context = self.model.config.context_length
        self.max_length = min(int(max_length), context) if max_length else context
        self.max_gen_toks = int(max_gen_toks)
        self._device = next(self.model.parameters()).device

    # -- TemplateLM plumbing ----------------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tok, "spec", "angpt")).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """Token ids of `string` (angpt tokenizers add no special tokens)."""
        return list(self.tok.encode(string))

    def tok_decode(self, tokens: Sequence[int], **kwargs: Any) -> str:
        return self.tok.decode(tokens)

    def get_model_info(self) -> dict[str, Any]:
        cfg = self.model.config
        return {"model_arch": cfg.arch, "model_num_parameters": self.model.num_params(), "context": cfg.context_length}

    # -- scoring ----------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of log p(continuation | context), whether greedy decoding reproduces it) for each token pair."""
        L = self.max_length
        out: list[tuple[float, bool] | None] = [None] * len(pairs)
        rows = []
        for i, (ctx, cont) in enumerate(pairs):
            if not cont:
                out[i] = (0.0, True)
                continue
            if len(cont) > L:
                raise UserError(f"a continuation of {len(cont)} tokens does not fit the context length {L}")
            whole = (list(ctx) + list(cont))[-(L + 1) :]
            rows.append((i, whole[:-1], list(cont)))
        rows.sort(key=lambda r: -len(r[1]))  # similar lengths per batch: less padding
        for lo in range(0, len(rows), self.batch_size):
            batch = rows[lo : lo + self.batch_size]
            T = len(batch[0][1])
            ids = torch.full((len(batch), T), self.eot_token_id, dtype=torch.long)
            for r, (_, inp, _) in enumerate(batch):
                ids[r, : len(inp)] = torch.tensor(inp)
            h = forward_hidden(self.model, ids.to(self.device))
            for r, (i, inp, cont) in enumerate(batch):
                # the logits at positions len(inp) - len(cont) .. len(inp) - 1 predict the continuation
                sel = h[r, len(inp) - len(cont) : len(inp)]
                logp = F.log_softmax(self.model.logits(sel[None])[0].float(), dim=-1)
                target = torch.tensor(cont, device=logp.device)
                total = float(logp.gather(-1, target[:, None]).sum())
                greedy = bool((logp.argmax(-1) == target).all())
                out[i] = (total, greedy)
        return out  # type: ignore[return-value]

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        results = self._score([(ctx, cont) for _, ctx, cont in requests])
        for (key, _, _), res in zip(requests, results):
            if getattr(self, "cache_hook", None) is not None:
                self.cache_hook.add_partial("loglikelihood", key, res)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Total log-likelihood of each text, over disjoint windows of the context length (EOS-prefixed)."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        pairs, owner = [], []
        for n, req in enumerate(requests):
            (text,) = req.args
            windows = get_rolling_token_windows(
                token_list=self.tok_encode(text),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            for window in map(make_disjoint_window, windows):
                pairs.append(window)
                owner.append(n)
        totals = [0.0] * len(requests)
        for n, (logp, _) in zip(owner, self._score(pairs)):
            totals[n] += logp
        for req, total in zip(requests, totals):
            if getattr(self, "cache_hook", None) is not None:
                self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # -- generation -------------------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled, with do_sample) continuations, cut before the task's `until` strings and EOS."""
        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for n, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(n)
        for members in groups.values():
            kwargs = dict(requests[members[0]].args[1])
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = min(int(kwargs.pop("max_gen_toks", self.max_gen_toks)), self.max_length - 1)
            do_sample = bool(kwargs.pop("do_sample", False))
            temperature = float(kwargs.pop("temperature", 1.0 if do_sample else 0.0))
            if not do_sample:
                temperature = 0.0
            budget = self.max_length - max_new  # left-truncate contexts so that context + generation fits
            prompts = [(self.tok_encode(requests[n].args[0]) or [self.eot_token_id])[-budget:] for n in members]
            texts = generate_ids_batch(
                self.model,
                self.tok,
                prompts,
                max_new_tokens=max_new,
                stop=until,
                batch_size=self.batch_size,
                temperature=temperature,
                top_k=kwargs.pop("top_k", None),
                top_p=kwargs.pop("top_p", None),
                seed=kwargs.pop("seed", None),
            )
            for n, text in zip(members, texts):
                out[n] = text
                if getattr(self, "cache_hook", None) is not None:
                    self.cache_hook.add_partial("generate_until", requests[n].args, text)
        return out  # type: ignore[return-value]


def _task_manager(tasks: Sequence[str], include_path: str | Path | Sequence[str | Path] | None):
    """A TaskManager that knows `tasks`; lm_eval's ~15k built-in tasks are indexed only when needed (~10 s)."""
    from lm_eval.tasks import TaskManager

    paths = None
    if include_path is not None:
        paths = [str(p) for p in ([include_path] if isinstance(include_path, (str, Path)) else include_path)]
        for p in paths:
            if not Path(p).exists():
                raise UserError(f"task include path {p} does not exist")
        local = TaskManager(include_path=paths, include_defaults=False)
        if all(t in local.all_tasks for t in tasks):
            return local
    manager = TaskManager(include_path=paths)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise UserError(
            f"unknown lm_eval task(s): {', '.join(unknown)}; check the names or pass include_path with their YAML"
        )
    return manager


def _hub_errors() -> tuple[type[BaseException], ...]:
    """What loading a task's dataset raises when the Hub is offline, unreachable or lacks it."""
    errors: list[type[BaseException]] = [ConnectionError]
    try:
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

        errors += [HfHubHTTPError, LocalEntryNotFoundError]
    except ImportError:  # pragma: no cover - older huggingface_hub
        pass
    try:
        from datasets.exceptions import DatasetNotFoundError

        errors.append(DatasetNotFoundError)
    except ImportError:  # pragma: no cover
        pass
    try:
        from requests.exceptions import RequestException

        errors.append(RequestException)
    except ImportError:  # pragma: no cover
        pass
    return tuple(errors)


def _hub_error(names: Sequence[str], e: BaseException) -> UserError:
    """One line for a task whose dataset could not be loaded from the Hub (offline, say): what, why, what to do."""
    import os

    offline = [v for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if os.environ.get(v, "").lower() in ("1", "true")]
    if _WENT_OFFLINE:
        where = "which did not answer within 3 s (so this run went offline rather than retry)"
    elif offline:
        where = f"which is offline here ({'='.join([offline[0], os.environ[offline[0]]])})"
    else:
        where = "(unreachable?)"
    cause = (str(e).strip().splitlines() or [e.__class__.__name__])[0]
    return UserError(
        f"lm_eval task(s) {', '.join(names)} need their dataset from the Hugging Face Hub {where}: {cause}; run once "
        "online to cache it, or use a local copy: --include FOLDER of task YAMLs with local data "
        "(this repository's example: --tasks capitals --include tasks/)"
    )


_WENT_OFFLINE = False  # set when go_offline_if_unreachable() switched this process to offline mode


def go_offline_if_unreachable() -> None:
    """Offline mode for this process when the Hub does not answer a 3 s probe: the Hub clients would otherwise
    retry for half a minute before failing; a task with local data (--include) loads the same either way."""
    import os
    import sys

    from angpt.data.sources import hub_offline, hub_reachable

    global _WENT_OFFLINE
    if hub_offline() or hub_reachable():
        return
    _WENT_OFFLINE = True
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    for module, name in (
        ("huggingface_hub.constants", "HF_HUB_OFFLINE"),
        ("datasets.config", "HF_HUB_OFFLINE"),
        ("datasets.config", "HF_DATASETS_OFFLINE"),
    ):
        if module in sys.modules and hasattr(sys.modules[module], name):  # read at import: set it where it was read
            setattr(sys.modules[module], name, True)


def check_tasks(tasks: str | Sequence[str], include_path: str | Path | Sequence[str | Path] | None = None) -> None:
    """Load `tasks` (and their datasets) once, so that an unknown task or one whose data cannot be had fails now,
    as a one-line UserError, rather than at the first evaluation of a training run."""
    names = _task_names(tasks)
    go_offline_if_unreachable()
    manager = _task_manager(names, include_path)
    try:
        if hasattr(manager, "load"):  # lm_eval >= 0.4.10
            manager.load(names)
        else:  # pragma: no cover
            from lm_eval.tasks import get_task_dict

            get_task_dict(names, manager)
    except _hub_errors() as e:
        raise _hub_error(names, e) from None


def _task_names(tasks: str | Sequence[str]) -> list[str]:
    names = [t.strip() for t in tasks.split(",")] if isinstance(tasks, str) else list(tasks)
    names = [t for t in names if t]
    if not names:
        raise UserError("no lm_eval tasks given")
    return names


def evaluate_tasks(
    model: torch.nn.Module,
    tokenizer: Any,
    tasks: str | Sequence[str],
    *,
    include_path: str | Path | Sequence[str | Path] | None = None,
    limit: int | float | None = None,
    batch_size: int = 8,
    num_fewshot: int | None = None,
    bootstrap_iters: int = 1000,
    log_samples: bool = False,
    seed: int = 0,
    device: str | None = None,
) -> dict[str, Any]:
    """Run lm_eval tasks on an angpt model; returns lm_eval's results dict (``results[task][metric]``, ...).

    `tasks` is a list of task names (or one comma-separated string); `include_path` adds folders of task YAML
    files (local data works offline, e.g. ``dataset_path: json`` with ``dataset_kwargs: {data_files: ...}``).
    `limit` caps the documents per task (an int, or a fraction).
    """
    import lm_eval

    names = _task_names(tasks)
    lm = AngptLM(model=model, tokenizer=tokenizer, batch_size=batch_size, device=device)
    go_offline_if_unreachable()
    manager = _task_manager(names, include_path)
    try:
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=names,
            task_manager=manager,
            limit=limit,
            num_fewshot=num_fewshot,
            bootstrap_iters=bootstrap_iters,
            log_samples=log_samples,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
    except _hub_errors() as e:  # raised while the tasks load their datasets, before any scoring
        raise _hub_error(names, e) from None
    return dict(results) if results is not None else {}


def task_evaluator(cfg) -> Callable[[torch.nn.Module, int], dict[str, float]]:
    """The in-loop evaluator of a run config's `train.eval_tasks`: (model, step) -> {"task/<task>/<metric>": x}.

    `angpt train` passes it to `angpt.train.loop.train(cfg, evaluators=[...])`.
    """
    from angpt.data import load_tokenizer

    tc = cfg.train
    tokenizer = load_tokenizer(cfg.data)
    check_tasks(tc.eval_tasks, tc.eval_tasks_include)  # before step 1, not at the first evaluation

    def evaluate(model: torch.nn.Module, step: int) -> dict[str, float]:
        was_training = model.training
        try:
            results = evaluate_tasks(
                model.eval(),
                tokenizer,
                tc.eval_tasks,
                include_path=tc.eval_tasks_include,
                limit=tc.eval_tasks_limit,
                bootstrap_iters=0,
            )
        finally:
            model.train(was_training)
        out = {}
        for task, metrics in results.get("results", {}).items():
            for name, value in metrics.items():
                if isinstance(value, (int, float)) and "stderr" not in name:
                    out[f"task/{task}/{name.split(',')[0]}"] = float(value)
        return out

    return evaluate

"""Export angpt models as Hugging Face transformers checkpoints, and import Qwen3 / Llama checkpoints back.

What each architecture becomes (``format="auto"``):

* GPT+ (RMSNorm, QK-norm) -> a native ``Qwen3ForCausalLM`` checkpoint (hf/qwen3.py's mapping).
* GPT (RMSNorm, no QK-norm) -> a native ``LlamaForCausalLM`` checkpoint: Llama is exactly that block.
* LN-scaling (either of the above with ``norm="ln_scaling"``) -> the same, with each pre-norm's 1/sqrt(l) factor
  folded into its RMSNorm gain (exact: ``scale * (g * x̂) = (scale * g) * x̂``).
* nGPT and anGPT -> folded (``angpt.fold_for_inference``) into the self-contained ``AngptFoldedForCausalLM``
  (hf/modeling_angpt.py, copied beside the weights; ``config.json`` carries an ``auto_map``), loadable with
  ``trust_remote_code=True`` where angpt is not installed, and without it once :func:`register` has run.
* Any model with LAUREL (``model.laurel``) -> the same folded class: GPT+ / GPT / LN-scaling with LAUREL as its
  "prenorm" form (pre-norms kept, LAUREL's weights folded in), anGPT with LAUREL's terms in its update.
* GPT+ with weight normalisation (gpt+wn) -> folded first (``FoldedGPT.fold``: each ``W = g V/||V||`` computed
  into a plain weight), then the native Qwen3 checkpoint of that GPT+; with LAUREL, the folded class as above.
* TokenFormer (registry export kind "custom") -> its own ``TokenformerForCausalLM`` (hf/modeling_tokenformer.py,
  copied beside the weights with modeling_angpt.py, whose helpers it imports), written by the module the registry
  entry names (``hf_module``: hf/tokenformer.py); loadable like the folded class.
* DyT and scaled cosine attention (gpt+cos) have no transformers equivalent and no folded class: exporting them,
  with or without LAUREL, is a UserError.
* The frozen-alpha controls (``ngpt_frozen_alpha``, ``angpt_frozen_alpha``) export as their base architecture.

An export folder holds ``config.json``, ``model.safetensors``, ``generation_config.json``, ``angpt_export.json``
(our marker: format, arch and the full angpt config), and, with a tokenizer, ``tokenizer.json``,
``tokenizer_config.json``, ``special_tokens_map.json`` and ``angpt_tokenizer.json``. It is built in a temporary
folder beside ``out_dir``. A new folder is renamed into place whole. A previous export is replaced only when asked
(``overwrite=True``, ``angpt export --overwrite``), and then only the export's own files (those the previous export
wrote, listed in its marker, and those this one writes): they are moved aside, the new ones moved in (the marker
last), then the old ones deleted, and a failure on the way puts the previous export back. Files the user added to
the folder are never touched. A folder that is neither empty nor an export is refused, with or without overwrite.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

from angpt.errors import CheckpointError, ConfigError, UserError
from angpt.hf.folder import MARKER, MODELING_FILE, WEIGHTS_FILE, check_target, move_into_place
from angpt.models import GPT, FoldedLM, ModelConfig, fold_for_inference, registry, unwrap

FORMATS = ("auto", "qwen3", "llama", "folded", "custom")
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


# ---------------------------------------------------------------------------------------------- registration
def register() -> None:
    """Register the folded classes, and each custom export's (TokenFormer), with AutoConfig / AutoModelForCausalLM
    (idempotent).

    After this, ``AutoModelForCausalLM.from_pretrained(export)`` loads a folded nGPT / anGPT export or a custom one
    without ``trust_remote_code`` (transformers prefers registered local code to the copied modelling file).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from angpt.hf.modeling_angpt import MODEL_TYPE, AngptFoldedConfig, AngptFoldedForCausalLM

    AutoConfig.register(MODEL_TYPE, AngptFoldedConfig, exist_ok=True)
    AutoModelForCausalLM.register(AngptFoldedConfig, AngptFoldedForCausalLM, exist_ok=True)
    for spec in registry.ARCHITECTURES.values():
        if spec.hf_module is not None:
            importlib.import_module(spec.hf_module).register()


# ---------------------------------------------------------------------------------------------------- export
def resolve_format(cfg: ModelConfig, format: str = "auto") -> str:
    """The export format of a model config: "qwen3", "llama", "folded" or "custom" (UserError when impossible)."""
    if format not in FORMATS:
        raise UserError(f"unknown export format {format!r}; use one of: {', '.join(FORMATS)}")
    if registry.get(cfg.arch).export in ("folded", "custom"):
        natural = registry.get(cfg.arch).export
    elif cfg.norm == "dyt":
        raise UserError(
            "DyT models have no Hugging Face equivalent (tanh in place of RMSNorm) and cannot be exported; "
            "export a GPT+ (norm=rmsnorm) or an nGPT / anGPT model"
        )
    elif cfg.attention == "cosine":
        raise UserError(
            f"export is not supported for {cfg.arch} (model.attention=cosine): scaled cosine attention has a learned "
            "temperature per head, which transformers' Qwen3 / Llama cannot express; export a GPT+ (attention=dot)"
        )
    elif cfg.laurel_parts:  # Qwen3 and Llama have no LAUREL: GPT+ with it is our folded class's "prenorm" form
        natural = "folded"
    else:
        natural = "qwen3" if cfg.qk_norm else "llama"
    if format != "auto" and format != natural:
        why = f" (qk_norm={cfg.qk_norm})" if natural in ("qwen3", "llama") else ""
        raise UserError(f"a {cfg.arch} model{why} exports as {natural!r}, not {format!r}")
    native = natural in ("qwen3", "llama")
    if native and cfg.softmax_scale is not None and abs(cfg.softmax_scale - cfg.head_dim**-0.5) > 1e-12:
        raise UserError(f"{natural} uses the softmax scale 1/sqrt(head_dim); unset model.softmax_scale to export")
    return natural


def export_hf(
    model: torch.nn.Module,
    out_dir: str | Path,
    tokenizer: Any = None,
    *,
    dtype: str = "float32",
    format: str = "auto",
    overwrite: bool = False,
) -> Path:
    """Write `model` (and `tokenizer`, an angpt Tokenizer) as a Hugging Face checkpoint folder; returns its path.

    `format` is "auto" (by architecture, see the module docstring) or one of "qwen3", "llama", "folded", "custom",
    which must then match the architecture. `dtype` ("float32", "bfloat16", "float16") is the stored weight dtype.
    `out_dir` must be missing, empty, or (with `overwrite`) a previous export; anything else is a UserError, raised
    before anything is written. Over a previous export the export's own files are replaced and any other file in
    the folder is left as it is.
    """
    base = unwrap(model)
    cfg: ModelConfig = base.config
    fmt = resolve_format(cfg, format)
    if dtype not in DTYPES:
        raise UserError(f"unknown export dtype {dtype!r}; use one of: float32, bfloat16, float16")
    torch_dtype = DTYPES[dtype]
    dtype_name = str(torch_dtype).removeprefix("torch.")
    out = Path(out_dir).expanduser().absolute()
    check_target(out, overwrite)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        if fmt == "folded":
            sd, hf_config = _folded_files(base, cfg, tmp)
        elif fmt == "custom":
            sd, hf_config = importlib.import_module(registry.get(cfg.arch).hf_module).export_files(base, tmp)
        else:  # the GPT family's fold: gpt+wn into a plain GPT+; GPT+ and GPT have nothing to fold (an fp32 copy)
            plain = fold_for_inference(base)
            sd, hf_config = _gpt_files(plain, plain.config, fmt)
        eos = tokenizer.eos_id if tokenizer is not None else None
        if eos is not None:
            hf_config.eos_token_id = hf_config.pad_token_id = hf_config.bos_token_id = eos
        hf_config.dtype = dtype_name  # what transformers >= 5 reads
        hf_config.save_pretrained(tmp)
        _add_torch_dtype(tmp / "config.json", dtype_name)
        _save_weights({k: v.detach().to("cpu", torch_dtype).contiguous() for k, v in sd.items()}, tmp / WEIGHTS_FILE)
        _save_generation_config(tmp, eos)
        if tokenizer is not None:
            _save_tokenizer(tokenizer, tmp, cfg.context_length)
        marker = {
            "format": fmt,
            "arch": cfg.arch,
            "dtype": dtype_name,
            "angpt_version": _version(),
            "config": cfg.to_dict(),
            "files": sorted([p.name for p in tmp.iterdir()] + [MARKER]),  # what a later re-export replaces
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2, default=str) + "\n", encoding="utf-8")
        move_into_place(tmp, out)
    except OSError as e:  # a full disk: as a checkpoint's write failure, one line (the previous export stands)
        raise CheckpointError(f"could not write the export to {out} ({e.strerror or e}); nothing there changed") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _gpt_files(model: GPT, cfg: ModelConfig, fmt: str):
    """Qwen3 / Llama state dict and config of a GPT-family model (LN-scaling folded into the norm gains)."""
    import transformers

    d, dff = cfg.d_model, cfg.ffn_dim
    sd: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": model.embed.weight,
        "model.norm.weight": model.final_norm.weight * model.final_norm.scale,
        "lm_head.weight": model.lm_head.weight,
    }
    for i, b in enumerate(model.blocks):
        p = f"model.layers.{i}."
        q, k, v = b.qkv.weight.split(d)
        u, z = b.up.weight.split(dff)
        sd |= {
            p + "input_layernorm.weight": b.attn_norm.weight * b.attn_norm.scale,
            p + "self_attn.q_proj.weight": q,
            p + "self_attn.k_proj.weight": k,
            p + "self_attn.v_proj.weight": v,
            p + "self_attn.o_proj.weight": b.proj.weight,
            p + "post_attention_layernorm.weight": b.mlp_norm.weight * b.mlp_norm.scale,
            p + "mlp.up_proj.weight": u,
            p + "mlp.gate_proj.weight": z,
            p + "mlp.down_proj.weight": b.down.weight,
        }
        if fmt == "qwen3":
            sd[p + "self_attn.q_norm.weight"] = b.q_norm.weight * b.q_norm.scale
            sd[p + "self_attn.k_norm.weight"] = b.k_norm.weight * b.k_norm.scale
    if fmt == "qwen3":
        from angpt.hf.qwen3 import qwen3_config_dict

        # LN-scaling is folded into the gains above, so the config is that of the plain RMSNorm model.
        hf_config = transformers.Qwen3Config(**qwen3_config_dict(dataclasses.replace(cfg, norm="rmsnorm")))
        hf_config.architectures = ["Qwen3ForCausalLM"]
    else:
        from angpt.hf.qwen3 import llama_family_config_dict

        hf_config = transformers.LlamaConfig(
            **llama_family_config_dict(cfg), mlp_bias=False, bos_token_id=None, eos_token_id=None
        )
        hf_config.architectures = ["LlamaForCausalLM"]
    return sd, hf_config


def _folded_files(model: torch.nn.Module, cfg: ModelConfig, tmp: Path):
    """Folded state dict and AngptFoldedConfig of an nGPT / anGPT / LAUREL model; copies the modelling file in."""
    from angpt.hf import modeling_angpt

    folded = model if isinstance(model, FoldedLM) else fold_for_inference(model)
    hf_config = modeling_angpt.AngptFoldedConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        max_position_embeddings=cfg.context_length,
        rope_theta=cfg.rope_theta,
        arch=cfg.arch,
        residual=folded.residual,
        qk_unit=folded.blocks[0].q_gain is not None,
        position_scale=folded.has_att_scale,
        hidden_act=cfg.activation,
        qk_norm=folded.blocks[0].q_norm is not None,
        norm_eps=cfg.norm_eps,
        softmax_scale=folded.blocks[0].scale,
        laurel_rank=cfg.laurel_rank if "lr" in cfg.laurel_parts else 0,
        laurel_pa_depth=cfg.laurel_pa_depth if "pa" in cfg.laurel_parts else 0,
        input_norm=cfg.input_norm if folded.residual == "scaled" else "none",
    )
    hf_config.architectures = ["AngptFoldedForCausalLM"]
    stem = Path(MODELING_FILE).stem
    hf_config.auto_map = {
        "AutoConfig": f"{stem}.AngptFoldedConfig",
        "AutoModelForCausalLM": f"{stem}.AngptFoldedForCausalLM",
    }
    shutil.copyfile(modeling_angpt.__file__, tmp / MODELING_FILE)
    return dict(folded.state_dict()), hf_config


def _save_weights(sd: dict[str, torch.Tensor], path: Path) -> None:
    from angpt.checkpoint import save_safetensors

    save_safetensors(sd, path)  # a write failure (a full disk) is an OSError, as every other file's here


def _save_generation_config(folder: Path, eos: int | None) -> None:
    from transformers import GenerationConfig

    # The training data puts EOS between documents, so EOS is also the natural start-of-text (bos) token. No
    # max_length: transformers 5 takes one stored here as set by the caller, and every generate(max_new_tokens=N)
    # then warns that both are set. The context is config.json's max_position_embeddings, which caps a generate()
    # that names no length (transformers' 20 new tokens, with its advice to pass max_new_tokens).
    GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos).save_pretrained(folder)


def _save_tokenizer(tokenizer: Any, folder: Path, context_length: int) -> None:
    """tokenizer.json (+ angpt's spec file) and the config files AutoTokenizer needs to load it offline."""
    tokenizer.save(folder)
    eos = tokenizer.eos_token
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos,
        "pad_token": eos,
        "model_max_length": context_length,
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
        "padding_side": "left",  # generation pads on the left
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n", encoding="utf-8")
    special = {"eos_token": eos, "pad_token": eos}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")


def _add_torch_dtype(config_json: Path, dtype_name: str) -> None:
    """Name the dtype under transformers 4.x's key too, so that an export made with either major version loads with
    the other. Written into the file: setting `torch_dtype` on a transformers 5 config logs a deprecation warning."""
    config = json.loads(config_json.read_text())
    config["torch_dtype"] = dtype_name
    config_json.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _version() -> str:
    import angpt

    return angpt.__version__


# ---------------------------------------------------------------------------------------------------- import
def import_hf(path: str | Path) -> torch.nn.Module:
    """Load a Hugging Face checkpoint folder as an angpt model (eval mode, fp32).

    Qwen3 checkpoints (multi-head attention, default RoPE, no biases) become GPT+; Llama checkpoints of the same
    kind become GPT (no QK-norm); angpt's own folded exports become a `FoldedLM`. Other model types are a
    CheckpointError.
    """
    folder = Path(path).expanduser()
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"no config.json in {folder}; pass a Hugging Face checkpoint folder")
    try:
        raw = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{cfg_file} is not readable JSON ({_line(e)})") from e
    if not isinstance(raw, dict):
        raise CheckpointError(f"{cfg_file} is not a JSON object; pass a Hugging Face checkpoint folder")
    model_type = raw.get("model_type")
    if model_type not in ("qwen3", "llama", "angpt_folded"):
        raise CheckpointError(
            f"{folder} holds a {model_type!r} model; import_hf reads qwen3 and llama checkpoints (and angpt's "
            "folded exports)"
        )
    sd = _load_weights(folder)
    if model_type == "qwen3":
        import transformers

        from angpt.hf.qwen3 import config_from_qwen3, gpt_from_qwen3_state_dict

        hf_config = transformers.Qwen3Config.from_pretrained(folder)
        _check_plain(hf_config, "qwen3")
        _tie_if_needed(hf_config, sd)
        model = gpt_from_qwen3_state_dict(config_from_qwen3(hf_config), sd)
    elif model_type == "llama":
        import transformers

        hf_config = transformers.LlamaConfig.from_pretrained(folder)
        _check_plain(hf_config, "llama")
        _tie_if_needed(hf_config, sd)
        model = _gpt_from_llama(hf_config, sd)
    else:
        model = _folded_from_export(folder, sd)
    return model.float().eval()


def _load_weights(folder: Path) -> dict[str, torch.Tensor]:
    single = folder / WEIGHTS_FILE
    index = folder / "model.safetensors.index.json"
    if single.is_file():
        return _load_safetensors(single)
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
            if not all(isinstance(s, str) for s in shards):
                raise TypeError("shard names must be strings")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index ({_line(e)})") from e
        sd: dict[str, torch.Tensor] = {}
        for shard in shards:
            sd |= _load_safetensors(folder / shard)
        return sd
    raise CheckpointError(f"no {WEIGHTS_FILE} (or sharded index) in {folder}; only safetensors weights are read")


def _load_safetensors(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.is_file():
        raise CheckpointError(f"{file} is missing; download or export the checkpoint again")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(
            f"{file} is truncated or corrupt ({_line(e)}); download or export the checkpoint again"
        ) from e


def _line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _check_plain(hf_config, kind: str) -> None:
    if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
        raise CheckpointError(f"this {kind} checkpoint has biases; angpt's GPT has none")
    if kind == "qwen3" and getattr(hf_config, "use_sliding_window", False):
        raise CheckpointError("this qwen3 checkpoint uses sliding-window attention, which angpt does not support")


def _tie_if_needed(hf_config, sd: dict[str, torch.Tensor]) -> None:
    # Tied checkpoints omit lm_head; our models are untied, so give the head its own copy of the embedding.
    tied = getattr(hf_config, "tie_word_embeddings", False)
    if "lm_head.weight" not in sd and tied and "model.embed_tokens.weight" in sd:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()


def _gpt_from_llama(hf_config, sd: dict[str, torch.Tensor]) -> GPT:
    from angpt.hf.qwen3 import config_from_qwen3, gpt_from_qwen3_state_dict
    from angpt.models import make_config

    # A Llama config has the same shape fields as Qwen3's, and its weights Qwen3's names minus QK-norm.
    cfg = make_config("gpt", config_from_qwen3(hf_config))
    try:
        return gpt_from_qwen3_state_dict(cfg, sd)
    except ConfigError as e:
        raise CheckpointError(f"llama checkpoint: {e}") from e


@torch.no_grad()
def _folded_from_export(folder: Path, sd: dict[str, torch.Tensor]) -> FoldedLM:
    marker = folder / MARKER
    if not marker.is_file():
        raise CheckpointError(f"{folder} is an angpt_folded model without {MARKER}; re-export it with angpt")
    cfg = ModelConfig.from_dict(json.loads(marker.read_text(encoding="utf-8"))["config"])
    model = registry.get(cfg.arch).folded(cfg)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"folded export does not match its config: missing {missing}, unexpected {unexpected}")
    return model


try:  # registering needs transformers, which an `angpt.hf` user has; the classes are then Auto-loadable
    register()
except ImportError:  # pragma: no cover
    pass

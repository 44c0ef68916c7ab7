"""Find and load the model: the bundled SmolLM2 GGUF (converted once to safetensors) or a local checkpoint.

Weights are only ever read from safetensors or GGUF, never from pickle files. A hub id is fetched into the Hugging Face
cache (kvviz/hub.py); nothing else is fetched.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from kvviz import settings
from kvviz.attention_support import AttentionRule, attention_modules, check
from kvviz.chat_template import PLAIN_TEMPLATE
from kvviz.checkpoint import BUNDLED_NAME, GGUF_MAGIC, bundled_gguf, cache_root, converted_dir
from kvviz.errors import ModelLoadError
from kvviz.geometry import Geometry
from kvviz.hub import hub_folder, looks_like_hub_id


def _geometry(name: str, doc: str) -> property:
    """A read-only property forwarding to the model's :class:`Geometry`."""
    return property(lambda self: getattr(self.geometry, name), doc=doc)


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for kvviz: eval mode, no grad, attention routed through kvviz's recorder."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    device: torch.device

    def __post_init__(self) -> None:
        self.attention  # checked once, before any pass: refused here, and a latent-attention model made to report

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def config(self):
        return self.model.config

    @cached_property
    def geometry(self) -> Geometry:
        """Layers, heads, KV heads, head dim, vocabulary and context window, from the config."""
        return Geometry.from_config(self.config.to_dict())

    layers = _geometry("layers", "Decoder layers.")
    heads = _geometry("heads", "Query heads per layer.")
    kv_heads = _geometry("kv_heads", "Key/value heads per layer (GQA: each serves ``heads // kv_heads`` query heads).")
    head_dim = _geometry("head_dim", "Channels per head.")

    @cached_property
    def attention(self) -> AttentionRule:
        """What the model's attention applies to the scores: scale, soft-cap, each layer's sliding window (checked
        when the model loads)."""
        return check(self.model, self.name)

    @cached_property
    def attention_modules(self) -> list[torch.nn.Module]:
        """The attention module of each layer with a KV cache, in kvviz's layer order (a hybrid model's recurrent
        layers have none)."""
        return attention_modules(self.model)

    @property
    def scaling(self) -> float:
        """Score scale as the model's attention modules use it (``1/√d_k`` in the llama family)."""
        return self.attention.scaling

    @property
    def bytes_per_slot(self) -> int:
        """Bytes one cached slot costs a session: its K and V in every layer plus its recorded queries."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return self.layers * element * (self.kv_heads * sum(self.geometry.cached_widths) + self.heads * self.head_dim)

    @property
    def context_window(self) -> int:
        return self.geometry.context_window

    @property
    def stop_ids(self) -> frozenset[int]:
        """Token ids that end a turn (generation config's and tokenizer's end-of-sequence ids)."""
        eos = self.model.generation_config.eos_token_id
        ids = set(eos if isinstance(eos, list) else [eos]) | {self.tokenizer.eos_token_id}
        return frozenset(i for i in ids if i is not None)

    def memory_capacity(self) -> int:
        """Bytes of memory on the model's device: the GPU's total on CUDA, else the machine's physical memory."""
        if self.device.type == "cuda":
            return torch.cuda.get_device_properties(self.device).total_memory
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

    @property
    def device_label(self) -> str:
        """Human-readable device and dtype, e.g. ``cpu · float32``."""
        return f"{self.device.type} · {str(self.dtype).removeprefix('torch.')}"


BUNDLED = "(bundled)"  # names the bundled model even where KVVIZ_MODEL names another
TINY = "tiny:"  # ``tiny:KIND``: a tiny random model of an architecture family (kvviz.tiny_models), no download


def allowed_models() -> list[str]:
    """The models a page may switch between: the bundled one and those listed in ``KVVIZ_MODELS`` (comma-separated
    folders, ``.gguf`` files or hub ids; the server's list, never the page's)."""
    listed = settings.listed("KVVIZ_MODELS")
    return [BUNDLED, *dict.fromkeys(m for m in listed if m != BUNDLED)]


def pick_device(requested: str | None = None, dtype: str | torch.dtype | None = None) -> tuple[torch.device, torch.dtype]:
    """CUDA (bf16, or fp16 where bf16 is unsupported) when available, else CPU fp32. ``dtype`` (or ``KVVIZ_DTYPE``,
    e.g. ``float32``) overrides the dtype, for instance to check a GPU against fp32 references."""
    name = requested or settings.text("KVVIZ_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    device = _device(name)
    dtype = dtype or settings.text("KVVIZ_DTYPE")
    if dtype is not None:
        chosen = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
        if not isinstance(chosen, torch.dtype) or not chosen.is_floating_point:
            raise ModelLoadError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
        return device, chosen
    if device.type == "cuda":
        return device, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return device, torch.float32


def _device(name: str) -> torch.device:
    """The device ``name`` (``KVVIZ_DEVICE`` or ``device=``) names, refused in one line when this machine has no such
    device (a CUDA device on a CPU build of torch, a GPU index past the last)."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ModelLoadError(f"unknown device {name!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ModelLoadError(f"device {name!r} asks for CUDA, which this machine's torch cannot use (a CPU build, "
                                 "or no GPU); use cpu (unset KVVIZ_DEVICE)")
        if device.index is not None and device.index >= count:
            raise ModelLoadError(f"device {name!r} does not exist: this machine has {count} CUDA device"
                                 f"{'s' if count != 1 else ''} (cuda:0 … cuda:{count - 1})")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"device {name!r} asks for Apple's MPS, which this machine does not have; use cpu")
    return device


def _check_gguf(path: Path) -> None:
    """Refuse files that are not GGUF before the slow parser sees them."""
    with path.open("rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise ModelLoadError(f"{path} is not a GGUF file (bad magic bytes); pass a .gguf file or a model folder")


def convert_gguf(gguf: Path) -> Path:
    """Convert a GGUF once to safetensors; atomic (a temp folder renamed into place), so an interrupted run is redone.

    Returns the folder holding ``model.safetensors``, ``config.json`` and the tokenizer files.
    """
    target = converted_dir(gguf)
    if (target / "config.json").is_file():
        return target
    _check_gguf(gguf)
    print(f"kvviz: converting {gguf.name} to safetensors in {target} (once; ~30 s)", file=sys.stderr)
    target.parent.mkdir(parents=True, exist_ok=True)
    hf_logging.enable_progress_bar()  # the conversion is slow: show its progress
    staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except Exception as exc:  # the GGUF parser raises many kinds of errors on truncated files
            raise ModelLoadError(f"cannot read {gguf} ({type(exc).__name__}: {exc}); the file may be truncated — "
                                 "reinstall it or pass another model") from exc
        model.hf_quantizer = None  # the weights are dequantized already; save them as plain tensors
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already after a successful rename
    return target


def model_source(path: str | os.PathLike | None) -> Path | None:
    """The file or folder ``--model`` names (None: the bundled model), checked without reading or converting it:
    refused when it does not exist, is not a ``.gguf`` file or lacks a config or safetensors weights."""
    path = path or settings.text("KVVIZ_MODEL")
    if path is None or path == BUNDLED:
        return None
    name = str(path)
    if name.startswith(TINY):
        _tiny_kind(name)
        return None  # built, not read: its tokenizer is the bundled model's
    source = hub_folder(name) if looks_like_hub_id(name) else Path(path).expanduser()
    if not source.exists():
        raise ModelLoadError(f"model path {source} does not exist; pass a Hugging Face checkpoint folder, a .gguf file "
                             "or a hub id (owner/name)")
    if source.is_file():
        if source.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{source} is not a .gguf file; pass a .gguf file or a checkpoint folder")
        return source
    if not (source / "config.json").is_file():
        raise ModelLoadError(f"{source} has no config.json; it is not a Hugging Face checkpoint folder")
    if not any(source.glob("*.safetensors")):
        raise ModelLoadError(f"{source} has no *.safetensors weights (pickle checkpoints are not loaded for safety)")
    return source


def resolve_checkpoint(path: str | os.PathLike | None) -> tuple[Path, str]:
    """Turn ``--model`` (None = bundled, a folder, a ``.gguf``, or a hub id such as ``Qwen/Qwen2.5-0.5B-Instruct``)
    into a safetensors folder and a display name."""
    source = model_source(path)
    if source is None:
        return convert_gguf(bundled_gguf()), BUNDLED_NAME
    if source.is_file():
        return convert_gguf(source), source.name
    name = str(path or settings.text("KVVIZ_MODEL"))
    return source, name if looks_like_hub_id(name) else source.name


def load_model(path: str | os.PathLike | None = None, device: str | None = None,
               device_map: str | None = None, dtype: str | torch.dtype | None = None) -> LoadedModel:
    """Load a decoder-only model for kvviz (bundled SmolLM2 by default) with the recording attention installed.

    ``device_map`` (or ``KVVIZ_DEVICE_MAP``), e.g. ``"auto"``, spreads a large checkpoint over several GPUs with
    accelerate. Raises :class:`ModelLoadError` with a message naming the fix when files are missing or unreadable.
    """
    device_map = device_map or settings.text("KVVIZ_DEVICE_MAP")
    from kvviz.recorder import ATTENTION_NAME, register  # registration is global and idempotent

    register()
    torch_device, dtype = pick_device(device, dtype)  # a device this machine lacks is refused before any file is read
    named = str(path or settings.text("KVVIZ_MODEL") or "")
    if named.startswith(TINY):
        return _tiny_model(named, torch_device, dtype)
    folder, name = resolve_checkpoint(path)
    hf_logging.disable_progress_bar()  # a warm load takes about a second: no bar needed
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype, use_safetensors=True, attn_implementation=ATTENTION_NAME, device_map=device_map
        )
    except Exception as exc:
        raise ModelLoadError(f"cannot load the model in {folder} ({type(exc).__name__}: {exc}); "
                             "delete that folder to convert again, or pass another model") from exc
    if not tokenizer.chat_template:  # a base model: plain turns (the page says so)
        tokenizer.chat_template = PLAIN_TEMPLATE
    if getattr(model.config, "is_encoder_decoder", False):
        raise ModelLoadError(f"{name} is not a decoder-only language model")
    check(model, name)  # refuses attention kvviz cannot reproduce
    if device_map is None:
        model.to(torch_device)
    else:  # accelerate placed the layers; inputs go where the embeddings are
        torch_device = model.get_input_embeddings().weight.device
    model.eval().requires_grad_(False)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, device=torch_device)


def _tiny_kind(name: str) -> str:
    """The family ``tiny:KIND`` names, refused in one line when kvviz has no tiny model of it."""
    from kvviz.tiny_models import ARCHITECTURES

    kind = name[len(TINY):]
    if kind not in ARCHITECTURES:
        raise ModelLoadError(f"there is no tiny model {kind!r}; choose one of "
                             f"{', '.join(TINY + k for k in ARCHITECTURES)}")
    return kind


def _tiny_model(name: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """``tiny:KIND``: a tiny randomly initialised model of that family (:func:`kvviz.tiny_models.tiny`, seeded: the
    same weights every time) with the bundled model's tokenizer, for trying an architecture without a download.
    Its replies are noise; its cache is the family's."""
    from kvviz.tiny_models import tiny

    kind = _tiny_kind(name)
    folder, _ = resolve_checkpoint(BUNDLED)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = tiny(kind).to(device=device, dtype=dtype).eval().requires_grad_(False)
    return LoadedModel(model=model, tokenizer=tokenizer, name=f"{name} (random weights)", device=device)

"""Hugging Face models by id or config directory, built on the meta device from the config
alone: no weights are downloaded and no parameter memory is allocated."""

from __future__ import annotations

import difflib
import os
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from fsdpviz.configs.common import module_class
from fsdpviz.errors import ConfigError

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass(frozen=True)
class HFModel:
    """A Hugging Face model on the meta device and a batch for it.

    ``model, inputs = fsdpviz.hf_model(...)`` unpacks into the two :func:`fsdpviz.analyze`
    takes; ``wrap_classes`` are the model's ``_no_split_modules`` classes (what accelerate's
    ``TRANSFORMER_BASED_WRAP`` wraps by default) and ``config`` the ``PretrainedConfig``.
    """

    name: str
    model: nn.Module
    inputs: dict[str, torch.Tensor]
    config: Any
    wrap_classes: list[type[nn.Module]] = field(default_factory=list)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.inputs))

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {list(v.shape)}" for k, v in self.inputs.items())
        numel = sum(p.numel() for p in self.model.parameters())
        wraps = ", ".join(c.__name__ for c in self.wrap_classes) or "none"
        return (
            f"HFModel({self.name!r}: {type(self.model).__name__}, {numel / 1e9:.2f}B "
            f"parameters on meta; inputs {shapes}; wrap classes {wraps})"
        )


def hf_model(
    name_or_path: str,
    *,
    batch: int = 1,
    seq: int | None = None,
    dtype: torch.dtype | str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> HFModel:
    """Build a Hugging Face model from its config on the meta device, with a batch.

    ``name_or_path`` is a hub id (``"meta-llama/Llama-3.1-8B"``: its ``config.json`` comes
    from the local cache or the hub, nothing else is fetched) or a directory with a
    ``config.json``. ``overrides`` change config fields (``{"num_hidden_layers": 4}``).
    The batch is ``batch`` sequences of ``seq`` tokens (default: the model's context, at
    most 2048) with ``labels`` so the model computes its own loss; vision and speech models
    get ``pixel_values`` / ``input_features`` of their configured size. ``dtype`` is the
    parameters' dtype (default float32, the master weights of mixed-precision training).

    Example::

        llama = fsdpviz.hf_model("meta-llama/Llama-3.1-8B", batch=2, seq=8192)
        report = fsdpviz.analyze(*llama, fully_shard=llama.wrap_classes, world_size=8)
    """
    try:
        import transformers  # lazy: optional (fsdpviz[hf])
    except ImportError as e:  # pragma: no cover - transformers is a test dependency
        raise ConfigError(
            'hf_model needs Hugging Face transformers: pip install "fsdpviz[hf]"'
        ) from e
    config = _config(transformers, name_or_path, dict(overrides or {}))
    model_dtype = _dtype(dtype)
    cls = _model_class(transformers, config, name_or_path)
    with torch.device("meta"):
        model = cls._from_config(config, dtype=model_dtype)
    model.train()
    names = list(getattr(model, "_no_split_modules", None) or [])
    wraps = [module_class(model, n, f"{name_or_path} _no_split_modules") for n in names]
    inputs = _batch(model, config, batch, seq)
    return HFModel(name_or_path, model, inputs, config, wraps)


def _config(transformers: Any, name_or_path: str, overrides: dict[str, Any]) -> Any:
    path = Path(name_or_path).expanduser()
    local = path.is_dir() or name_or_path.startswith((".", "/", "~"))
    if local and not (path / "config.json").is_file():
        raise ConfigError(
            f"no config.json in {str(path)!r}: pass a directory holding the model's "
            "config.json (as saved by config.save_pretrained) or a Hugging Face hub id"
        )
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    unreachable = None if local or offline else _hub_unreachable()
    try:
        config = transformers.AutoConfig.from_pretrained(
            str(path) if local else name_or_path, local_files_only=unreachable is not None
        )
    except OSError as e:
        if offline:
            where = "offline (HF_HUB_OFFLINE is set)"
        elif unreachable is not None:
            where = f"not reachable from here ({unreachable})"
        else:
            where = "not reachable or refused"
        raise ConfigError(
            f"the config of {name_or_path!r} (its config.json) is not in the Hugging Face "
            f"cache and the hub is {where}: fetch it once where the hub is reachable "
            f"(`hf download {name_or_path} config.json`; gated models need `hf auth "
            "login`), or pass a directory holding config.json. "
            f"transformers said: {str(e).splitlines()[0]}"
        ) from None
    except ValueError as e:
        raise ConfigError(f"{name_or_path!r}: {e}") from None
    for key, value in overrides.items():
        if not hasattr(config, key):
            fields = sorted(config.to_dict())
            close = difflib.get_close_matches(key, fields, n=1)
            tip = f"did you mean {close[0]!r}?" if close else "see its config.json"
            raise ConfigError(f"{type(config).__name__} has no field {key!r} to set; {tip}")
        try:
            setattr(config, key, _override(config, key, value))
        except (TypeError, ValueError) as e:  # transformers' own validation of the field
            cause = e.__cause__ or e
            raise ConfigError(
                f"{type(config).__name__}.{key}={value!r} is refused: {cause}"
            ) from None
    return config


def _override(config: Any, key: str, value: Any) -> Any:
    """``value`` for the config field ``key``, refused where its type cannot be the field's
    (``num_hidden_layers="two"`` would fail deep inside the model's constructor)."""
    current = getattr(config, key)
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(current, bool):
        ok, kind = isinstance(value, bool), "true or false"
    elif isinstance(current, int):
        ok, kind = numeric and float(value).is_integer(), "an integer"
        value = int(value) if ok else value
    elif isinstance(current, float):
        ok, kind = numeric, "a number"
        value = float(value) if ok else value
    else:
        return value
    if not ok:
        raise ConfigError(
            f"{type(config).__name__}.{key} is {kind} (it is {current!r}), got {value!r}; "
            f"set {kind}, e.g. {key}={_literal(current)}"
        )
    return value


def _literal(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached (None when it can, or when a proxy decides):
    one connection, so an unreachable hub fails now instead of after the hub client's five
    retries."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    try:
        from huggingface_hub import constants  # lazy: optional, with transformers

        endpoint = str(constants.ENDPOINT)
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return None
    url = urlparse(endpoint)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    found: list[Any] = []
    # getaddrinfo takes no timeout (a resolver without network can take 20 s to give up)
    resolve = threading.Thread(
        target=lambda: found.append(_resolve(host, port)), daemon=True, name="fsdpviz-hub-dns"
    )
    resolve.start()
    resolve.join(timeout)
    if not found:
        return f"{endpoint}: no answer for {host} within {timeout:.0f} s"
    if isinstance(found[0], OSError):
        return f"{endpoint}: {found[0].strerror or type(found[0]).__name__}"
    family, kind, proto, _, address = found[0]
    try:
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(timeout)
            sock.connect(address)
        return None
    except OSError as e:
        return f"{endpoint}: {e.strerror or type(e).__name__}"


def _resolve(host: str, port: int) -> Any:
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as e:
        return e


def _dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype.lower() in DTYPES:
        return DTYPES[dtype.lower()]
    raise ConfigError(f"dtype={dtype!r} is not valid; use one of {', '.join(DTYPES)}")


def _model_class(transformers: Any, config: Any, name: str) -> Any:
    """The class the config names in ``architectures``, else a causal LM, else the base."""
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    for auto in ("AutoModelForCausalLM", "AutoModel"):
        mapping = getattr(transformers, auto)._model_mapping
        if type(config) in mapping:
            return mapping[type(config)]
    raise ConfigError(f"{name!r}: transformers has no model class for {type(config).__name__}")


def _batch(model: nn.Module, config: Any, batch: int, seq: int | None) -> dict[str, torch.Tensor]:
    """A batch of the size the model takes; token ids are 0 (any id is fine on meta)."""
    main = getattr(model, "main_input_name", "input_ids")
    text = getattr(config, "get_text_config", lambda: config)()
    context = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    length = seq or min(int(context or 2048), 2048)
    if main == "input_ids":
        ids = torch.zeros(batch, length, dtype=torch.long)
        labels = torch.zeros(batch, dtype=torch.long) if _classifies(model) else ids
        return {"input_ids": ids, "labels": labels}
    if main == "pixel_values":
        size = getattr(config, "image_size", 224)
        size = size if isinstance(size, int) else int(size[0])
        channels = getattr(config, "num_channels", 3)
        return {"pixel_values": torch.zeros(batch, channels, size, size)}
    if main == "input_features":
        mels = getattr(config, "num_mel_bins", 80)
        frames = 2 * getattr(config, "max_source_positions", 1500)
        inputs = {"input_features": torch.zeros(batch, mels, frames)}
        if getattr(config, "is_encoder_decoder", False):
            inputs["labels"] = torch.zeros(batch, min(length, 448), dtype=torch.long)
        return inputs
    raise ConfigError(
        f"{type(model).__name__} takes {main!r}; build its inputs yourself and pass "
        "hf_model(...).model with them to fsdpviz.analyze"
    )


def _classifies(model: nn.Module) -> bool:
    name = type(model).__name__
    return name.endswith(("ForSequenceClassification", "ForImageClassification"))

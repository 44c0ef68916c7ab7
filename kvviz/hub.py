"""Models named by a Hugging Face hub id (``Qwen/Qwen2.5-0.5B-Instruct``): fetched once into the hub's own local
cache (the one transformers uses), read from there afterwards — also offline (``HF_HUB_OFFLINE=1`` or no network)
when the model is already cached. Only configs, tokenizer files and safetensors weights are fetched."""

from __future__ import annotations

import re
from pathlib import Path

from kvviz.errors import ModelLoadError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.tiktoken", "*.jinja"]


def looks_like_hub_id(text: str) -> bool:
    """``owner/name`` that is not a path on this machine."""
    return bool(HUB_ID.match(text)) and not Path(text).expanduser().exists()


def hub_folder(repo_id: str) -> Path:
    """The local snapshot folder of ``repo_id`` (downloaded into the hub cache if needed and possible)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    try:
        return Path(snapshot_download(repo_id, allow_patterns=FILES))
    except LocalEntryNotFoundError:
        raise ModelLoadError(f"{repo_id} is not in the local Hugging Face cache and the hub cannot be reached "
                             "(offline); fetch it once with a network connection, or pass a local folder") from None
    except GatedRepoError:
        raise ModelLoadError(f"{repo_id} is gated on the hub: accept its terms and log in (huggingface-cli login) "
                             "first") from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise ModelLoadError(f"there is no model {repo_id} on the Hugging Face hub (or it is private)") from None
    except OSError as exc:  # network errors, a full disk
        raise ModelLoadError(f"cannot fetch {repo_id} from the Hugging Face hub ({type(exc).__name__}: {exc})") from None

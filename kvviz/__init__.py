"""kvviz: see and edit the KV cache of a real language model.

The public API, for notebooks and scripts (the dashboard in ``app/`` uses the same)::

    from kvviz import Edit, Session, load_model, what_if

    lm = load_model()                      # the bundled SmolLM2-135M (or a folder / .gguf path)
    session = Session(lm)
    session.add_user_turn("My name is Ada and I live in Lisbon. Where do I live?")
    session.generate(16)
    result = what_if(session, Edit.evict(range(10, 20)))
    result.next_token.kl, result.heads["rho"]   # KL(full ‖ edited), ρ per layer × query head

In a notebook the session, a what-if, a policy run, a blame and a sweep show themselves (``kvviz.notebook.reprs``),
and ``kvviz.widget(session)`` is a live strip with the what-if of the clicked edit (``docs/notebook.md``).

The library never imports streamlit; ``app/`` lays out what it computes. How the pieces fit: ``docs/architecture.md``;
the formulas: ``docs/math.md``.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what editors and type checkers resolve; at run time each name loads on first use (below)
    from kvviz.edit.draft import EditDraft
    from kvviz.edit.edit import Edit, Eviction
    from kvviz.errors import KvvizError, ModelLoadError
    from kvviz.figures import (alpha_chart, figures_html, growth, head_grid_chart, head_map_figure, hidden_chart,
                               overview_figure, row_figure, topk_frame)
    from kvviz.model import LoadedModel, load_model
    from kvviz.notebook import CacheWidget, widget
    from kvviz.policies import (H2O, POLICIES, TOVA, AdaKV, Candidates, KeyNorm, Policy, PyramidKV, RandomPolicy,
                                SnapKV, StreamingLLM)
    from kvviz.schemes.cache_format import CacheFormat
    from kvviz.schemes.kivi import Kivi
    from kvviz.quant.quantizer import Quantizer
    from kvviz.runs import Blame, CompressedSession, PolicyRun, RunSettings, blame, from_names, restore, run_policy
    from kvviz.sampling import Sampling
    from kvviz.session import Session
    from kvviz.session_file import export_session, import_session
    from kvviz.whatif import (CacheBytes, NextToken, PolicyComparison, WhatIf, compare_policies, step_memory,
                              what_if)

# name -> module; loaded on first use, so ``import kvviz`` (and ``python -m kvviz``) stays light
_EXPORTS = {
    "EditDraft": "kvviz.edit.draft", "Edit": "kvviz.edit.edit", "Eviction": "kvviz.edit.edit",
    "KvvizError": "kvviz.errors", "ModelLoadError": "kvviz.errors", "LoadedModel": "kvviz.model",
    "load_model": "kvviz.model", "CacheFormat": "kvviz.schemes.cache_format", "Kivi": "kvviz.schemes.kivi",
    "Quantizer": "kvviz.quant.quantizer",
    "Sampling": "kvviz.sampling", "Session": "kvviz.session", "CacheWidget": "kvviz.notebook",
    "widget": "kvviz.notebook",
    "export_session": "kvviz.session_file", "import_session": "kvviz.session_file",
    **dict.fromkeys(["POLICIES", "H2O", "TOVA", "AdaKV", "Candidates", "KeyNorm", "Policy", "PyramidKV",
                     "RandomPolicy", "SnapKV", "StreamingLLM"], "kvviz.policies"),
    **dict.fromkeys(["Blame", "CompressedSession", "PolicyRun", "RunSettings", "blame", "from_names", "restore",
                     "run_policy"], "kvviz.runs"),
    **dict.fromkeys(["CacheBytes", "NextToken", "PolicyComparison", "WhatIf", "compare_policies", "step_memory",
                     "what_if"], "kvviz.whatif"),
    **dict.fromkeys(["alpha_chart", "figures_html", "growth", "head_grid_chart", "head_map_figure", "hidden_chart",
                     "overview_figure", "row_figure", "topk_frame"], "kvviz.figures"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kvviz' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


# In an IPython kernel (Jupyter, VS Code, Colab), kvviz's objects show as HTML: the formatter is told these classes by
# name (kvviz.notebook.reprs.RENDERERS holds their renderers), and the renderers load when the first object is shown.
_VIEWS = (("kvviz.session", "Session"), ("kvviz.whatif.step", "WhatIf"), ("kvviz.runs.run_records", "PolicyRun"),
          ("kvviz.runs.blame", "Blame"), ("kvviz.sweeps.table", "Sweep"))


def _view(value: Any) -> str:
    return importlib.import_module("kvviz.notebook.reprs").html(value).text


def _register_views() -> None:
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    formatters = getattr(getattr(shell, "display_formatter", None), "formatters", {})
    if "text/html" in formatters:
        for module, name in _VIEWS:
            formatters["text/html"].for_type_by_name(module, name, _view)


_register_views()

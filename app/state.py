"""A page's state, all in ``st.session_state``: its keys and defaults, the getters views read, and every write of it
(with app/persistence.py, which starts, saves and restores the page's session; no other module writes it by code —
tests/unit/test_page_state_writers.py — while widgets write their own keys, as Streamlit's widgets do)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import streamlit as st

from app import housekeeping
from app.server_memory import KEPT
from kvviz.edit.draft import EditDraft
from kvviz.session import Session
from kvviz.session_file import export_session

SESSION_ID = re.compile(r"[0-9a-f]{32}")  # the ?s= URL parameter (full match); nothing else names an autosave file

MEAN = -1  # the "head" setting that means the mean over query heads

DEFAULTS = {"layer": 0, "head": MEAN, "at": None, "max_new_tokens": 48, "large": False, "notice": None,
            # the editor's settings, read before its widgets are drawn (see app/main.py's editor)
            "key_axis": "channel", "value_axis": "token", "group": 0, "symmetric": False, "number_format": "int", "fp8_scales": "dynamic", "pre_rope": False,
            "pick_k": 4, "pick_v": 4, "topk": 10, "continuation": 0, "raw_special_tokens": False}


def page() -> str:
    """The server's name of this page (its memory budget's key)."""
    return housekeeping.page_id(st.session_state.get("sid", ""))


def make_room(tokens: int) -> None:
    """Ask the server's memory budget for ``tokens`` more slots of this page's session (other sessions' derived data,
    then idle sessions, are released for it); refuses with :class:`KvvizError` when it cannot."""
    memory = st.session_state.get("server_memory")
    if memory is not None:
        memory.make_room(page(), tokens, session().lm.bytes_per_slot)


def session() -> Session:
    return st.session_state.session


def draft() -> EditDraft:
    return st.session_state.draft


def replace(session: Session, draft: EditDraft, view: dict | None = None, at: int | None = None,
            branch: str = "main", branches: list[dict] | None = None) -> None:
    """Show another session (imported, restored or a demo's) with its draft; ``view`` settings (layer, head, step)
    where given, else the step ``at``. Another conversation has no branches; a branch of this one (``branch`` its
    name) keeps the others (``branches``, see :func:`branches`)."""
    st.session_state.session, st.session_state.draft, st.session_state.at = session, draft, at
    st.session_state.branch, st.session_state.branches = branch, list(branches or [])
    st.session_state.update({k: v for k, v in (view or {}).items() if k in ("layer", "head", "at")})
    st.session_state.prepared = list((view or {}).get("prepared", []))


def branch() -> str:
    """The name of the branch shown ("main" until a fork)."""
    return st.session_state.get("branch", "main")


def branches() -> list[dict]:
    """The conversation's other branches, each ``{"name", "document"}``: kept as session documents (a few KB, nothing
    for the memory budget to release) and replayed when chosen; they live as long as the page."""
    return st.session_state.setdefault("branches", [])


def fork_to(child: Session, name: str) -> None:
    """Show the fork ``child`` as the branch ``name``; the branch it left is kept (see :func:`branches`)."""
    replace(child, EditDraft(), at=None, branch=name, branches=[*branches(), _shown_branch()])


def _shown_branch() -> dict:
    """The branch shown, as :func:`branches` keeps it: its name and its session document as its file would read
    back (JSON's lists, not tuples)."""
    document = json.loads(json.dumps(export_session(session(), draft()), ensure_ascii=False))
    return {"name": branch(), "document": document}


def switch_branch(index: int, chosen: Session, chosen_draft: EditDraft) -> None:
    """Show the kept branch ``index`` (replayed as ``chosen``); the one shown now takes its place in the list."""
    others = branches()
    name = others[index]["name"]
    replace(chosen, chosen_draft, at=None, branch=name,
            branches=[*others[:index], _shown_branch(), *others[index + 1:]])


def prepared() -> list[dict]:
    """The edits kept for the standalone page (``{"at", "edit", "label"}`` as a session file holds them)."""
    return st.session_state.setdefault("prepared", [])


def travel(at: int | None) -> None:
    """Show the step of slot ``at`` (None: always the newest)."""
    st.session_state.at = at


def choose_model(path: str | None) -> None:
    """Load the model at ``path`` on the next run (None: back to the default); this page's session starts anew."""
    if path is None:
        st.session_state.pop("model_path", None)
        return
    st.session_state.model_path = path
    for key in ("session", "draft"):
        st.session_state.pop(key, None)


def model_path() -> str | None:
    return st.session_state.get("model_path")


def keep(name: str, value) -> None:
    """Keep a result of :data:`KEPT` to show until the next one (a toy example and its cases, the last policy
    comparison, policy run or blame); None drops it."""
    if name not in KEPT:
        raise KeyError(name)
    st.session_state[name] = value


def kept(name: str):
    """The result kept under ``name`` (see :func:`keep`), or None."""
    return st.session_state.get(name)


def keep_detail(detail) -> None:
    """The detail of the what-if just computed: the strip draws a sparse model's indexer scores from it."""
    st.session_state["whatif_detail"] = detail


def whatif_detail():
    """The detail :func:`keep_detail` kept, or None."""
    return st.session_state.get("whatif_detail")


def keep_policy_run(result, blame=None, named: str | None = None) -> None:
    """A new policy run drops the blame of the previous one. ``named``: the policy as the person chose it, where that
    differs from the policy's own name (a kvpress press run as the kvviz policy that reproduces it)."""
    keep("policy_run", result)
    keep("policy_blame", blame)
    st.session_state.policy_run_named = named


def ask_before(work, why: str | None) -> None:
    """Hold ``work`` (a policy run) back with ``why`` it may not do what the person wants, until they confirm it;
    ``why`` None (or a new form sent) lets nothing wait."""
    st.session_state.asked = None if why is None else (work, why)


def asked():
    """The work held back and why (see :func:`ask_before`), or None."""
    return st.session_state.get("asked")


def keep_sweep(sweep) -> None:
    """Keep the sweep this page ran (a :class:`~kvviz.sweeps.table.Sweep`: rows, no tensors) until the next one; None
    drops it."""
    st.session_state.page_sweep = sweep


def page_sweep():
    """The sweep this page ran, or None."""
    return st.session_state.get("page_sweep")


def run_press_defaults(press: bool | None = None) -> None:
    """The Policy run form's ratio starts at 0 (set here: no widget default to fight); ``press`` True (a kvpress press
    was just chosen): what kvpress does — compress once after the prompt, at a ratio of 0.5 unless one is given."""
    st.session_state.setdefault("run-ratio", 0.0)
    if press:
        st.session_state["run-mode"] = "prefill"
        if not st.session_state["run-ratio"]:
            st.session_state["run-ratio"] = 0.5


def policy_run_named() -> str | None:
    """The name the kept policy run was chosen by (see :func:`keep_policy_run`)."""
    return st.session_state.get("policy_run_named")


def upload_key() -> str:
    """The import uploader's key: a new one after each load, so a refused or stale file never stays behind."""
    return f"import_file_{st.session_state.get('uploads', 0)}"


def clear_upload() -> None:
    st.session_state.uploads = st.session_state.get("uploads", 0) + 1


def take_notice() -> tuple[str, bool] | None:
    """The message noted for this run and whether it is a plain note rather than a warning (see :func:`notify`),
    once."""
    notice, st.session_state.notice = st.session_state.notice, None
    return notice


def step_slot() -> int:
    """The slot whose step the views show: the chosen one (time travel) or the newest cached slot."""
    newest = len(session()) - 1
    chosen = st.session_state.at
    return newest if chosen is None else max(0, min(chosen, newest))


def head() -> int | None:
    """The chosen query head, or None for the mean over heads."""
    return None if st.session_state.head == MEAN else st.session_state.head


def detail_head() -> int:
    """The head the detail views use (head 0 when the strip shows the mean)."""
    return head() or 0


FORMAT_WIDTHS = {"e4m3": 8, "e5m2": 8, "nvfp4": 4, "mxfp4": 4}  # number formats with one width of their own
FP4_BLOCKS = {"nvfp4": 16, "mxfp4": 32}


def fit_format() -> None:
    """The quantizer settings' format just chosen, with an axis or a width of its own (FP8: 8 bits; NVFP4 / MXFP4:
    4 bits, keys and values per token, the format's own scales and blocks): set what it needs — the axes, the bit
    picker and the draft's quantized slots (``EditDraft.rewidth``) — so the edit being tried applies at once, and say
    what changed in a note."""
    ss, chosen, said = st.session_state, st.session_state.number_format, []
    if chosen in FP4_BLOCKS:
        if (ss.key_axis, ss.value_axis) != ("token", "token"):
            ss.key_axis = ss.value_axis = "token"
            said.append("keys and values per token (its blocks are channels of one slot)")
        if ss.symmetric:
            ss.symmetric = False
            said.append("Symmetric off (the format has its own scales)")
        if ss.group not in (0, FP4_BLOCKS[chosen]):
            ss.group = 0
            said.append(f"Group size 0 (its own blocks of {FP4_BLOCKS[chosen]} channels)")
    width = FORMAT_WIDTHS.get(chosen)
    if width is not None:
        if (ss.pick_k, ss.pick_v) != (width, width):
            ss.pick_k = ss.pick_v = width
            said.append(f"K and V bits to {width}")
        moved = draft().rewidth(width)
        if moved:
            said.append(f"the {moved} slot{'s' * (moved != 1)} you are trying to {width} bits")
    if said:
        notify(f"{chosen} stores {width} bits" + (" per element in blocks" if chosen in FP4_BLOCKS else "")
               + ": set " + "; ".join(said) + ".", note=True)


def notify(message: str, note: bool = False) -> None:
    """A message shown once at the top of the next run: a warning (e.g. a refused click, reported from a callback), or
    with ``note`` a plain note (what a demo shows, where a result went)."""
    st.session_state.notice = (message, note)


def choose_head(layer: int, head: int, whole_page: bool = True) -> None:
    """Every view shows ``layer`` and query ``head`` (:data:`MEAN`: the mean over heads); ``whole_page``: a click in
    a fragment reruns the whole page, so the views outside it show them too."""
    st.session_state.layer, st.session_state.head = layer, head
    if whole_page:
        st.session_state.whole_page = True


def show_in_views(continuation: int | None = None, chart: str | None = None,
                  channels: tuple[int, int] | None = None) -> None:
    """What a demo or a tour step shows: the what-if's ``continuation`` tokens, its ``chart``, the Channels tab's
    (layer, KV head)."""
    if continuation is not None:
        st.session_state.continuation = continuation
    if chart is not None:
        st.session_state.whatif_chart = chart
    if channels is not None:
        st.session_state.channels_layer, st.session_state.channels_kv_head = channels


def open_view(name: str) -> None:
    """Open the view tab ``name`` on the next run (a view opening another: a policy run opened from a sweep)."""
    st.session_state.open_view = name


def take_open_view() -> None:
    """Before the tabs are drawn: the view another asked for (:func:`open_view`) becomes the open tab, once."""
    if chosen := st.session_state.pop("open_view", None):
        st.session_state.view = chosen


def show_step_in_pickers() -> None:
    """The time-travel slider and the jump box show the step in view (set here: no widget default to fight)."""
    st.session_state.at_slider = st.session_state.at_jump = step_slot()


def look_at(place: str) -> None:
    """Count one more request to bring ``place`` into view (app/components/scroll.py scrolls once per count)."""
    st.session_state[f"scroll_{place}"] = scrolls(place) + 1


def scrolls(place: str) -> int:
    """How often ``place`` was asked to come into view (see :func:`look_at`)."""
    return st.session_state.get(f"scroll_{place}", 0)


def finish_run() -> int:
    """Count one more finished run of the page or of a fragment; the count (app/components/settled.py shows it)."""
    st.session_state.kv_runs = st.session_state.get("kv_runs", 0) + 1
    return st.session_state.kv_runs


def hand_over(work: object) -> None:
    """Keep long work asked for in a view until the page's own run takes it (app/long_work.py)."""
    st.session_state.long_work = work


def take_work() -> object | None:
    """The work handed over, once."""
    return st.session_state.pop("long_work", None)


QUANTIZER_SETTINGS = ("key_axis", "value_axis", "group", "symmetric", "number_format", "fp8_scales", "pre_rope")


def quantizer_settings() -> SimpleNamespace:
    """The editor's quantizer settings as they stand (a copy to read: its widgets write them)."""
    return SimpleNamespace(**{key: st.session_state[key] for key in QUANTIZER_SETTINGS})

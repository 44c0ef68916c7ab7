""""What am I looking at?": a short guide above the chat, open until the first message."""

from __future__ import annotations

import streamlit as st

from app import state

GUIDE = """
- **The cache.** The model reads your message and writes its reply one token at a time; every token it has processed
  keeps its key and value vectors (K/V) in the **KV cache**, one *slot* each. The strip below the chat shows one chip
  per slot. Its coloured band is the slot's segment: **history** (earlier turns, grey), **query** (your new message,
  read in one prefill, blue), **generated** (the reply, one decode step per token, orange). A chip's red background is how
  much the current step attends to that slot.
- **Edit it.** Click chips to **evict** them (the step no longer sees their K/V) or pick **bits** to quantize them. The
  what-if below re-runs the step with your edit beside the unedited one: **KL** and **total variation** of the next-token
  distributions, whether the top token **flips**, **ρ** (the share of a head's attention the evicted slots had) and
  **α′ = α/(1−ρ)** (the rest, rescaled), and **‖Δo‖** (how much each head's output moved).
- **Keep it.** *Commit* makes the edit part of the conversation (later steps run on the edited cache; undo it from the
  list under the strip). The step slider travels back to any earlier step; there, *Fork* re-runs the conversation from
  that step on the edited cache as a new branch.
- **The tabs.** *Attention*: every layer × head at this step, and one head's full map. *Cache growth*: the cache by
  segment over time. *Policies*: eviction policies (H2O, SnapKV, StreamingLLM, …) as a mask at this step.
  *Policy run*: a policy compressing the cache as it really runs over a reply. *Sweeps*: many prompts, ranked by damage.
- The math behind every number is in `docs/math.md` of the kvviz repository, how it is built in `docs/architecture.md`.
"""


def render() -> None:
    # open until the first message, except on a projector (presentation mode): there it would fill the first screen
    with st.expander("What am I looking at?", expanded=len(state.session()) == 0 and not st.session_state.large):
        st.markdown(GUIDE)

"""Chat: the conversation as plain text (never Markdown/HTML), streaming, one-step decoding for teaching."""

from __future__ import annotations

import streamlit as st

from app import persistence, state
from app.components.scroll import look_at, scroll_here
from app.plain import code, warn
from kvviz.errors import KvvizError
from kvviz.spelling import spell
from kvviz.view_data import reply_as_cached

SAVE_SECONDS = 1.0  # a reply being written is autosaved this often (a kill or reload loses at most this much)
LONG = 1200  # characters: a longer message is shown folded
LONG_PREFILL = 512  # tokens: a message this long shows its prefill's progress


def _message(role: str, text: str) -> None:
    """One chat message as plain text; a long one folded to its start, the whole of it one click away."""
    message = st.chat_message(role)
    if len(text) <= LONG:
        message.text(text)
        return
    message.text(text[: LONG // 2] + f" … ({len(text) - LONG // 2:,} more characters)")
    message.expander("The whole message").text(text)


def render() -> None:
    session = state.session()
    turns = session.conversation()
    for index, turn in enumerate(turns):
        _message("user", turn["user"])
        if index < len(turns) - 1:
            if turn["assistant"]:
                _message("assistant", turn["assistant"])
            continue
        cached, next_piece = reply_as_cached(session)  # the newest reply exactly as the strip holds it
        if cached or next_piece is not None:
            message = st.chat_message("assistant")
            message.text(cached)
            if next_piece is not None:
                message.caption(f"next token (chosen, not cached yet): {code(spell(next_piece))} · id {session.pending}")
    pending = session.pending_token()
    st.toggle("Read control tokens I type (e.g. <|im_end|>) as real ones", key="raw_special_tokens",
              help="Off: what you type is text, so a message cannot end its turn or open a system turn. On: typed "
                   "control strings become the model's control tokens (outlined in purple on the strip).")
    # a first message this small model answers from what it is told (it ignores many a fact, "My dog is called Rex"
    # among them: "Your dog is a Greyhound"), so the first eviction shows its point
    hint = "Try: My cat is called Whiskers. What is my cat called? — then click “Whiskers” in the strip" if not turns \
        else "Message the model (Stop: press any button while it writes)"
    prompt = st.chat_input(hint)  # pinned at the bottom
    _, stop, right = st.columns([3, 1, 1.6 if st.session_state.get("large", False) else 1])  # large type: wider
    stop.button("Stop", disabled=not prompt, help="Stops the reply being written between two decode steps (the cache "
                "stays whole); enabled while one is written")
    with right:
        can_step = pending is not None and not session.turn_ended
        if st.button("Step one token", disabled=not can_step, help="Decode exactly one token (teaching mode)"):
            if _guard(session.step):
                session.set_announced(len(session.produced))  # every chosen token is now part of the reply
            state.travel(None)
            st.rerun()
    if prompt:
        st.chat_message("user").text(prompt)
        tokens = len(session.lm.tokenizer.encode(prompt)) + st.session_state.max_new_tokens
        if _guard(lambda: state.make_room(tokens)) is None:
            return
        if _guard(lambda: _prefill(session, prompt, tokens - st.session_state.max_new_tokens)) is None:
            return
        state.travel(None)
        persistence.save()  # the message is kept before the reply starts, and the reply as it grows
        answer = st.chat_message("assistant")
        with answer:
            scroll_here(f"reply-{len(session.turns)}", key="scroll-reply")  # the reply on screen while it streams
        placeholder = answer.empty()
        for _ in session.stream(st.session_state.max_new_tokens):
            placeholder.text(session.reply)
            persistence.save_every(SAVE_SECONDS)
        look_at("strip")
        st.rerun()


def _prefill(session, prompt: str, tokens: int) -> list[int]:
    """Add the turn; a long message shows the prefill's progress, layer by layer of each chunk. Stop (or any button)
    during it cancels the message: the pass is atomic, so the session stays as it was."""
    bar = st.progress(0.0) if tokens >= LONG_PREFILL else None
    if bar is not None:
        session.on_layer = lambda done, total: bar.progress(
            done / total, text=f"Reading your message (about {tokens:,} tokens): {done / total:.0%} · Stop cancels it")
    try:
        return session.add_user_turn(prompt, st.session_state.raw_special_tokens)
    finally:
        session.on_layer = None
        if bar is not None:
            bar.empty()


def _guard(action):
    """Run ``action``; a refusal becomes an inline warning (the session is unchanged)."""
    try:
        return action() or True
    except KvvizError as exc:
        warn(exc)
        return None

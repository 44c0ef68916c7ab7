"""A user message as new tokens: the whole conversation rendered with the model's chat template, minus what is cached.

Rendering only the new message would re-insert the template's default system prompt; rendering everything and
keeping the tail after the cached ids prefills exactly what the model has not seen.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from kvviz.errors import KvvizError


# for a tokenizer without a chat template (a base model, e.g. a GGUF that carries none): plain "User:" / "Assistant:"
# turns after the tokenizer's begin-of-sequence token
PLAIN_TEMPLATE = ("{{ bos_token or '' }}{% for m in messages %}{{ 'User: ' if m['role'] == 'user' else 'Assistant: ' }}"
                  "{{ m['content'] }}\n\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")


def check_unicode(text: str) -> None:
    """Refuse text that is not valid Unicode (lone surrogates cannot be tokenized)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise KvvizError(f"the message contains U+{ord(bad):04X}, a lone surrogate that is not valid Unicode; "
                         "remove it") from None


def control_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Ids of the tokenizer's special added tokens (``<|im_start|>``, ``<|im_end|>``, …): the chat's control tokens."""
    return {index for index, token in tokenizer.added_tokens_decoder.items() if token.special}


def render(tokenizer: PreTrainedTokenizerBase, messages: list[dict]) -> tuple[list[int], set[int]]:
    """The ids of ``messages`` rendered with the chat template (and the prompt for the assistant's reply), and the
    indices among them of control tokens that come from a user's text.

    A user message is tokenized as text — control strings in it (``<|im_end|>``) split into ordinary tokens — unless
    it has ``"raw": True``; then they are the real control tokens, and their indices are returned."""
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    encoded = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), [tuple(o) for o in encoded["offset_mapping"]]
    control, typed_control = control_ids(tokenizer), set()
    spans = _spans(tokenizer, messages, rendered)
    for first, end, message in reversed(spans):  # right to left: splicing keeps earlier offsets valid
        inside = [i for i, (a, b) in enumerate(offsets) if first <= a and b <= end and b > a]
        if message["role"] != "user" or not any(ids[i] in control for i in inside):
            continue
        if message.get("raw"):
            typed_control |= {i for i in inside if ids[i] in control}
            continue
        low, high = inside[0], inside[-1] + 1
        if offsets[low][0] != first or offsets[high - 1][1] != end:
            raise KvvizError("this message's control strings cannot be kept as plain text with this tokenizer; "
                             "remove them or allow raw special tokens")
        text = tokenizer(rendered[first:end], add_special_tokens=False, split_special_tokens=True)["input_ids"]
        ids[low:high], offsets[low:high] = text, [(first, first)] * len(text)
    return ids, typed_control


def _spans(tokenizer: PreTrainedTokenizerBase, messages: list[dict], rendered: str) -> list[tuple[int, int, dict]]:
    """Where each message's text stands in ``rendered``: the template rendered with a unique mark for each content
    says where (a content can also occur in the template's own text), checked against ``rendered``; when the template
    changes the contents (so the marks do not say), the first match after the previous message."""
    marks = [f"\ue000{index}\ue001" for index in range(len(messages))]
    marked = tokenizer.apply_chat_template([m | {"content": mark} for m, mark in zip(messages, marks)],
                                           add_generation_prompt=True, tokenize=False)
    spans, pieces, cursor, length = [], [], 0, 0
    for message, mark in zip(messages, marks):
        at = marked.find(mark, cursor)
        if at < 0:
            break
        pieces += [marked[cursor:at], message["content"]]
        length += at - cursor
        spans.append((length, length + len(message["content"]), message))
        length += len(message["content"])
        cursor = at + len(mark)
    if len(spans) == len(messages) and "".join(pieces) + marked[cursor:] == rendered:
        return spans
    spans, start = [], 0
    for message in messages:
        found = rendered.find(message["content"], start) if message["content"] else -1
        if found >= 0:
            start = found + len(message["content"])
            spans.append((found, start, message))
    return spans


def chat_delta(tokenizer: PreTrainedTokenizerBase, messages: list[dict], cached: list[int]
               ) -> tuple[list[int], set[int]]:
    """New ids for ``messages`` after the ``cached`` ids (see :func:`render`), and the indices among them of control
    tokens typed by the user. When the model's own tokens re-tokenize differently, the tokens of the rendered text
    after the cached text."""
    full, typed_control = render(tokenizer, messages)
    if full[: len(cached)] == cached:
        return full[len(cached):], {i - len(cached) for i in typed_control if i >= len(cached)}
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    cached_text = tokenizer.decode(cached, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if not rendered.startswith(cached_text):
        raise KvvizError("the chat template does not continue the cached tokens; start a new conversation")
    return tokenizer.encode(rendered[len(cached_text):], add_special_tokens=False), set()

"""A user message as new tokens: the whole conversation rendered with the model's chat template, minus what is cached.

Rendering only the new message would re-insert the template's default system prompt; rendering everything and
keeping the tail after the cached ids prefills exactly what the model has not seen.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from kvviz.errors import KvvizError


def check_unicode(text: str) -> None:
    """Refuse text that is not valid Unicode (lone surrogates cannot be tokenized)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise KvvizError(f"the message contains U+{ord(bad):04X}, a lone surrogate that is not valid Unicode; "
                         "remove it") from None


def chat_delta(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], cached: list[int]) -> list[int]:
    """New ids for ``messages`` after the ``cached`` ids: the rendered ids after them (or, when the model's own tokens
    re-tokenize differently, the tokens of the rendered text after the cached text)."""
    full = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    if full[: len(cached)] == cached:
        return list(full[len(cached) :])
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    cached_text = tokenizer.decode(cached, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if not rendered.startswith(cached_text):
        raise KvvizError("the chat template does not continue the cached tokens; start a new conversation")
    return tokenizer.encode(rendered[len(cached_text) :], add_special_tokens=False)

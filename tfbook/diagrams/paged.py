"""A diagram of Part VI: one sequence's block table, from its logical blocks to the pool.

    from tfbook.diagrams.paged import block_table
    block_table(allocator, "c")      # a BlockAllocator after some reserve/commit/release

Drawn from the allocator's own state: the sequence's positions in logical blocks of
`block_size` (the last one partly filled), its block table (one pool block per logical block,
in order) and the pool, where each row is one block: the sequence's rows show the positions
they hold, rows held by other sequences are shaded, free rows are dashed. An arrow goes from
each table entry to the pool row it names.

Label keys: "title", "logical.i" (the number of logical block i), "pos.i.j" (position in
logical block i, offset j), "table.i" (entry i of the table), "pool.b.j" (the position pool
block b holds at offset j, for this sequence), "row.b" (the number of pool block b).
"""

from __future__ import annotations

from collections.abc import Hashable

from tfbook.diagrams._shared import note
from tfbook.diagrams.diagram import Diagram
from tfbook.diagrams.svg import FONT, SMALL, Canvas
from tfbook.generate.paged import BlockAllocator, blocks_needed

CELL = 22.0  # one position of a block
ROW = 24.0  # height of one block's row
GAP = 6.0  # between two rows
LEFT = 26.0  # room for the logical block names
TABLE_X = 130.0  # the block table's column
ENTRY = 30.0  # width of one table entry
POOL_X = 214.0  # the pool's row numbers
MAX_BLOCKS = 12  # pool rows that fit a phone's column in height and stay readable
MAX_SIZE = 4  # positions per block drawn (4 cells fit a phone's column twice)


def block_table(allocator: BlockAllocator, seq: Hashable) -> Diagram:
    """Sequence `seq`'s logical blocks -> its block table -> the rows of the pool they name."""
    if not isinstance(allocator, BlockAllocator):
        raise TypeError(f"block_table needs a BlockAllocator, got {type(allocator).__name__}")
    table = allocator._table(seq)  # refuses an unknown sequence with tfbook's ValueError
    size, length, n_blocks = allocator.block_size, allocator.lengths[seq], allocator.num_blocks
    if size > MAX_SIZE or n_blocks > MAX_BLOCKS:
        raise ValueError(f"block_table draws at most {MAX_BLOCKS} blocks of at most {MAX_SIZE} "
                         f"positions, got {n_blocks} blocks of {size}: draw a smaller pool")
    if not length:
        raise ValueError(f"sequence {seq!r} holds no positions yet: nothing to draw")
    others = {b for s, t in allocator.tables.items() if s != seq for b in t}
    c = Canvas(f"the block table of sequence {seq}: {length} positions in blocks "
               f"{', '.join(map(str, table))}")
    c.text(0, FONT, f"sequence {seq}: {length} positions, blocks of {size}", FONT, bold=True,
           anchor="start", key="title")
    top = FONT + 26
    c.text(LEFT, top - 8, "logical blocks", SMALL, anchor="start")
    c.text(TABLE_X + ENTRY / 2, top - 8, "table", SMALL)
    c.text(POOL_X, top - 8, "pool", SMALL, anchor="start")

    def row_y(i: int) -> float:
        return top + i * (ROW + GAP)

    for i in range(len(table)):  # the sequence as the model sees it, block after block
        y = row_y(i)
        c.text(LEFT - 6, y + ROW / 2 + 4.5, str(i), SMALL, anchor="end", key=f"logical.{i}")
        for j in range(size):
            t = i * size + j
            x = LEFT + j * CELL
            c.box(x + 1, y, CELL - 2, ROW, "attn" if t < length else "data",
                  dashed=t >= length, radius=2)
            if t < length:
                c.text(x + CELL / 2, y + ROW / 2 + 4.5, str(t), SMALL, key=f"pos.{i}.{j}")
        c.box(TABLE_X, y, ENTRY, ROW, "head", radius=3)
        c.text(TABLE_X + ENTRY / 2, y + ROW / 2 + 4.5, str(table[i]), SMALL, key=f"table.{i}")
        c.line([(TABLE_X + ENTRY, y + ROW / 2), (POOL_X - 4, row_y(table[i]) + ROW / 2)],
               edge="the table names the pool block that holds this logical block")
    holds = {block: i for i, block in enumerate(table)}
    for b in range(n_blocks):
        y = row_y(b)
        c.text(POOL_X + 14, y + ROW / 2 + 4.5, str(b), SMALL, anchor="end", key=f"row.{b}")
        for j in range(size):
            x = POOL_X + 20 + j * CELL
            if b in holds:
                t = holds[b] * size + j
                c.box(x + 1, y, CELL - 2, ROW, "attn" if t < length else "data",
                      dashed=t >= length, radius=2)
                if t < length:
                    c.text(x + CELL / 2, y + ROW / 2 + 4.5, str(t), SMALL, key=f"pool.{b}.{j}")
            else:
                c.box(x + 1, y, CELL - 2, ROW, "mask" if b in others else "data",
                      dashed=b not in others, radius=2)
    y = row_y(max(len(table), n_blocks)) + 10
    for n, line in enumerate((f"blue: the positions of {seq}",
                              "dashed: room (a dashed row: a free block)",
                              "grey: blocks of other sequences")):
        note(c, 0, y + n * (SMALL + 6), line)
    assert len(table) >= blocks_needed(length, size)  # the allocator's own invariant
    return Diagram(c)

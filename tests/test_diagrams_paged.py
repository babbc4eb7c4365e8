"""The block-table diagram: every number on it is the allocator's (positions, table, pool rows)."""

from __future__ import annotations

import re

import pytest

from tfbook.diagrams.paged import block_table
from tfbook.generate.paged import BlockAllocator


def chapter_allocator() -> BlockAllocator:
    """The chapter's example: a and b share a pool of 6 blocks of 4; a ends, c takes 9."""
    alloc = BlockAllocator(num_blocks=6, block_size=4)
    for seq, n in (("a", 5), ("b", 5)):
        alloc.add(seq)
        alloc.reserve(seq, n)
        alloc.commit(seq, n)
    alloc.release("a")
    alloc.add("c")
    alloc.reserve("c", 9)
    alloc.commit("c", 9)
    return alloc


@pytest.mark.parametrize("seq", ["b", "c"])
def test_the_drawing_is_the_allocators_state(seq) -> None:
    alloc = chapter_allocator()
    labels = block_table(alloc, seq).shape_labels
    table, length, size = alloc.tables[seq], alloc.lengths[seq], alloc.block_size
    assert [labels[f"table.{i}"] for i in range(len(table))] == [str(b) for b in table]
    assert f"table.{len(table)}" not in labels
    assert [labels[f"logical.{i}"] for i in range(len(table))] == [
        str(i) for i in range(len(table))]
    for t in range(length):  # each position in its logical block and in the pool row it names
        assert labels[f"pos.{t // size}.{t % size}"] == str(t)
        assert labels[f"pool.{table[t // size]}.{t % size}"] == str(t)
    drawn = [k for k in labels if k.startswith("pool.")]
    assert len(drawn) == length  # the partly filled last block shows only what it holds
    assert [labels[f"row.{b}"] for b in range(alloc.num_blocks)] == [
        str(b) for b in range(alloc.num_blocks)]
    assert labels["title"] == f"sequence {seq}: {length} positions, blocks of {size}"


def test_one_arrow_per_table_entry_each_with_its_reason() -> None:
    d = block_table(chapter_allocator(), "c")
    assert d.svg.count("<polygon") == 3 and d.wired  # three arrowheads, none unexplained
    assert 'class="bx dash"' in d.svg  # the room left in c's last block is drawn dashed


def test_changing_the_allocator_changes_the_drawing() -> None:
    alloc = chapter_allocator()
    before = block_table(alloc, "c").svg
    alloc.reserve("c", 1)
    alloc.commit("c", 1)
    assert block_table(alloc, "c").shape_labels["pool.0.1"] == "9"
    assert block_table(alloc, "c").svg != before


def test_fits_a_phone() -> None:
    d = block_table(chapter_allocator(), "c")
    assert float(re.search(r"min-width:([\d.]+)px", d.svg).group(1)) <= 350
    big = BlockAllocator(num_blocks=12, block_size=4)
    big.add("s")
    big.reserve("s", 48)
    big.commit("s", 48)
    assert float(re.search(r"min-width:([\d.]+)px", block_table(big, "s").svg).group(1)) <= 350


def test_bad_input_is_refused() -> None:
    alloc = chapter_allocator()
    with pytest.raises(TypeError, match="block_table needs a BlockAllocator, got dict"):
        block_table({}, "c")
    with pytest.raises(ValueError, match=r"no sequence 'x' in this cache; known: \['b', 'c'\]"):
        block_table(alloc, "x")
    with pytest.raises(TypeError, match="a sequence id must be hashable and not a bool"):
        block_table(alloc, ["c"])
    alloc.add("d")
    with pytest.raises(ValueError, match="sequence 'd' holds no positions yet"):
        block_table(alloc, "d")
    with pytest.raises(ValueError, match="at most 12 blocks of at most 4 positions, got 13 "
                                         "blocks of 4"):
        block_table(_with(BlockAllocator(13, 4)), "s")
    with pytest.raises(ValueError, match="got 4 blocks of 8"):
        block_table(_with(BlockAllocator(4, 8)), "s")


def _with(alloc: BlockAllocator) -> BlockAllocator:
    alloc.add("s")
    alloc.reserve("s", 3)
    alloc.commit("s", 3)
    return alloc

"""The persistent CTAs' walks over a causal plan's tiles, in plain Python (the kernel runs the
same integer code through the DSL): every tile visited exactly once, and the CTAs' key blocks
balanced. No GPU, no compile."""

from __future__ import annotations

from collections import Counter

import pytest

from frostc.kernels.tile_walks import paired_tile

PY_OPS = (lambda c, a, b: a if c else b, min, max)


def walk(m_blocks: int, head_batches: int, grid: int) -> list[tuple[int, int]]:
    """(query block, head-batch) of every visit, in visit order (CTA v % grid makes visit v)."""
    return [paired_tile(v, m_blocks, head_batches, grid, PY_OPS) for v in range(m_blocks * head_batches)]


@pytest.mark.parametrize("grid", [1, 5, 132])
@pytest.mark.parametrize("head_batches", [1, 3, 16, 100])
@pytest.mark.parametrize("m_blocks", range(1, 26))
def test_every_tile_is_visited_once(m_blocks: int, head_batches: int, grid: int) -> None:
    tiles = walk(m_blocks, head_batches, grid)
    assert sorted(tiles) == [(m, hb) for m in range(m_blocks) for hb in range(head_batches)]


@pytest.mark.parametrize(("m_blocks", "head_batches"), [(4, 256), (8, 128), (12, 100), (11, 64), (6, 512)])
def test_ctas_get_pairs_of_equal_cost_and_the_rest_balanced(m_blocks: int, head_batches: int) -> None:
    """Causal: query block m sees m + 1 key blocks. Whole rounds hand each CTA one pair (the
    longer tile first, of one head); no CTA ends more than one tile's cost above the mean."""
    grid = 132
    tiles = walk(m_blocks, head_batches, grid)
    cost = Counter()
    for v, (m, _) in enumerate(tiles):
        cost[v % grid] += m + 1
    mean = sum(cost.values()) / grid
    assert max(cost.values()) - mean <= m_blocks
    first_pair = tiles[0], tiles[grid]  # CTA 0's first two visits
    assert first_pair[0][1] == first_pair[1][1] and first_pair[0][0] + first_pair[1][0] == m_blocks - 1
    assert first_pair[0][0] > first_pair[1][0]


def test_pairs_go_head_by_head() -> None:
    """The first round's CTAs share a few heads (K and V in L2), not all of them."""
    tiles = walk(8, 128, 132)
    assert len({hb for _, hb in tiles[:132]}) == 132 // 4

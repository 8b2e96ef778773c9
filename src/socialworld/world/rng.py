"""The world's one random stream, forkable in O(1).

A :class:`WorldRNG` is a cursor over an infinite stream of uniforms in [0, 1). The stream is
produced block by block by ``numpy.random.Generator(PCG64(SeedSequence(seed, spawn_key=(b,))))``
for block ``b``; blocks are immutable and shared between forks, so forking copies one integer
instead of a generator's state (copying a ``Generator`` alone would exceed the fork budget). Same
seed, same stream; the global RNG is never touched.
"""

from __future__ import annotations

import hashlib

import numpy as np

BLOCK = 2048


class _Blocks:
    """Lazily generated, shared, immutable blocks of one seed's stream."""

    __slots__ = ("seed", "blocks")

    def __init__(self, seed: int):
        self.seed = seed
        self.blocks: list[list[float]] = []

    def get(self, index: int) -> list[float]:
        while len(self.blocks) <= index:
            ss = np.random.SeedSequence(self.seed, spawn_key=(len(self.blocks),))
            self.blocks.append(np.random.Generator(np.random.PCG64(ss)).random(BLOCK).tolist())
        return self.blocks[index]


class WorldRNG:
    """Uniform, range, choice and integer draws from the world's stream."""

    __slots__ = ("_blocks", "cursor")

    def __init__(self, seed: int, cursor: int = 0, _blocks: _Blocks | None = None):
        if seed < 0:
            raise ValueError("seed must be non-negative")
        self._blocks = _blocks if _blocks is not None else _Blocks(seed)
        self.cursor = cursor

    @property
    def seed(self) -> int:
        return self._blocks.seed

    def random(self) -> float:
        c = self.cursor
        self.cursor = c + 1
        b, i = divmod(c, BLOCK)
        blocks = self._blocks.blocks
        return (blocks[b] if b < len(blocks) else self._blocks.get(b))[i]

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self.random()

    def integers(self, low: int, high_inclusive: int) -> int:
        return low + min(int(self.random() * (high_inclusive - low + 1)), high_inclusive - low)

    def choice(self, items):
        return items[self.integers(0, len(items) - 1)]

    def bernoulli(self, p: float) -> bool:
        return self.random() < p

    def shuffled(self, items) -> list:
        out = list(items)
        for i in range(len(out) - 1, 0, -1):
            j = self.integers(0, i)
            out[i], out[j] = out[j], out[i]
        return out

    def fork(self) -> WorldRNG:
        return WorldRNG(self.seed, self.cursor, self._blocks)

    def state(self) -> dict[str, int]:
        return {"seed": self.seed, "cursor": self.cursor}

    @classmethod
    def from_state(cls, state: dict[str, int]) -> WorldRNG:
        return cls(int(state["seed"]), int(state["cursor"]))


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed derived from parts (run seed, scenario id, episode index...)."""
    entropy = [p if isinstance(p, int) else int.from_bytes(hashlib.sha256(p.encode()).digest()[:8], "little") for p in parts]
    hi, lo = (int(x) for x in np.random.SeedSequence(entropy).generate_state(2, np.uint32))
    return ((hi << 32) | lo) & ((1 << 63) - 1)

"""WordCount: source → split → count (count is stateful, fields-grouped by word)."""

from __future__ import annotations

import random

from testbed.live.topology import OperatorSpec, TopologySpec, Tuple

WORDS = (
    "stream cluster operator latency queue tuple window state worker node cap core "
    "thread epoch slot source sink count split predict demand"
).split()
WORDS_PER_SENTENCE = 5


def _sentence(n: int, rng: random.Random) -> tuple[str, str]:
    return str(n), " ".join(rng.choice(WORDS) for _ in range(WORDS_PER_SENTENCE))


def _emit_sentence(t: Tuple, state: dict) -> list[tuple[str, str]]:
    return [(t.key, t.value)]


def _split(t: Tuple, state: dict) -> list[tuple[str, str]]:
    return [(w, w) for w in t.value.split()]


def _count(t: Tuple, state: dict) -> list:
    state[t.key] = state.get(t.key, 0) + 1
    return []


def wordcount(
    app: str = "wordcount",
    parallelism: int = 4,
    source_ms: float = 0.2,
    split_ms: float = 1.0,
    count_ms: float = 0.3,
) -> TopologySpec:
    """The topology; costs are CPU milliseconds per input tuple of each operator."""
    return TopologySpec(
        app=app,
        operators=(
            OperatorSpec("source", parallelism, source_ms, _emit_sentence),
            OperatorSpec("split", parallelism, split_ms, _split, upstream=("source",)),
            OperatorSpec(
                "count",
                parallelism,
                count_ms,
                _count,
                upstream=("split",),
                stateful=True,
                grouping="fields",
            ),
        ),
        make_root=_sentence,
    )


FANOUT = {"source": 1.0, "split": float(WORDS_PER_SENTENCE)}

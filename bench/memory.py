"""Memory at 100,000 memories in the embedded store (issue #6 targets: `discover` p50 ≤ 20 ms hybrid at 100k;
context build ≤ 5 ms per turn, keyword and hybrid, p50 and p99).

Loads 100k memories (8–16 words drawn Zipf-like from a 20,000-word vocabulary, as in text, with precomputed
random 384-d unit vectors, the size of all-MiniLM-L6-v2's) into a fresh SQLite file, in one import per 5,000
rows. Then prints medians of:
`discover` keyword-only (no embedding provider) and hybrid (an embedder that returns a precomputed query
vector, so the model's own time is not counted); `store` throughput through the tool (one transaction per
memory, as a run writes them); and the context build of one turn (`<memory>` + `<graph_context>` notes).

Run: `.venv/bin/python bench/memory.py [--n 100000] [--runs 100]`
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path

import numpy as np

from ringlet.context import RunContext
from ringlet.memory import Memory, memory_toolset
from ringlet.store import Store
from ringlet.store.memory_records import Scope

WORDS = [
    "deploy", "service", "database", "cache", "outage", "latency", "invoice", "customer", "payment", "refund",
    "ticket", "alert", "cluster", "node", "region", "backup", "restore", "schema", "migration", "queue", "worker",
    "token", "secret", "rotate", "audit", "policy", "approval", "release", "rollback", "canary", "metric",
    "dashboard", "incident", "postmortem", "owner", "team"
]
DIM = 384
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
VOCABULARY = WORDS + sorted({"".join(random.Random(i).choices(SYLLABLES, k=random.Random(-i).randint(2, 4)))
                             for i in range(20_000)})
"""A Zipfian vocabulary (like text): a few words are in many memories, most in few."""
ZIPF = np.cumsum(1 / np.arange(1, len(VOCABULARY) + 1) ** 1.07)


class Precomputed:
    """An embedder whose vectors are already known: only ringlet's own search is timed."""

    name = "bench:precomputed"

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    async def embed(self, texts: list[str]) -> np.ndarray:
        v = self.rng.standard_normal((len(texts), DIM)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def sentence(rng: random.Random) -> str:
    draws = np.searchsorted(ZIPF, [rng.random() * ZIPF[-1] for _ in range(rng.randint(8, 16))])
    return " ".join(VOCABULARY[i] for i in draws)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def seconds(work: Awaitable[object]) -> float:
    """How long `work` takes, in seconds."""
    started = time.perf_counter()
    await work
    return time.perf_counter() - started


def p99_ms(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98] * 1000 if len(samples) > 1 else median_ms(samples)


async def main(n: int, runs: int) -> None:
    rng, nrng = random.Random(7), np.random.default_rng(7)
    folder = Path(tempfile.mkdtemp(prefix="ringlet-bench-memory-"))
    store = await Store.open(f"sqlite+aiosqlite:///{folder / 'memory.db'}")
    scope = Scope("bench", "default")
    ctx = RunContext(run_id="r_bench", agent="bench", realm=scope.realm, org_id=scope.org_id)
    records = store.memory
    started = time.perf_counter()
    for start in range(0, n, 5000):
        vectors = nrng.standard_normal((min(5000, n - start), DIM)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        batch = [{"id": f"n_{start + i:07d}", "labels": ["Memory"], "title": text[:100], "content": text,
                  "properties": {"kind": "fact"}, "tags": [], "embedding": vectors[i]}
                 for i, text in enumerate(sentence(rng) for _ in range(len(vectors)))]
        await records.import_items(scope, batch, [])
    load_s = time.perf_counter() - started
    entities = [{"id": f"svc_{w}", "labels": ["Service"], "title": w, "content": w,
                 "properties": {"name": w}, "tags": []} for w in WORDS[:10]]
    await records.import_items(scope, entities, [{"from": f"svc_{a}", "to": f"svc_{b}", "relation": "DEPENDS_ON",
                                                  "strength": 1.0, "metadata": {}}
                                                 for a, b in itertools.pairwise(WORDS[:10])])
    keyword, hybrid = Memory(store), Memory(store, embeddings=Precomputed(nrng))  # type: ignore[arg-type]
    queries = [sentence(rng)[:80] for _ in range(runs)]
    cold = time.perf_counter()
    await hybrid.search(scope, queries[0], limit=10)  # loads the realm's vectors into the cache once
    cold_s = time.perf_counter() - cold
    kw, hy, notes, hybrid_notes = [], [], [], []
    for q in queries:
        kw.append(await seconds(keyword.search(scope, q, limit=10)))
        hy.append(await seconds(hybrid.search(scope, q, limit=10)))
        notes.append(await seconds(keyword.notes(ctx, f"Is the deploy of service cache healthy? {q}")))
        hybrid_notes.append(await seconds(hybrid.notes(ctx, f"Is the deploy of service cache down? {q}")))
    assert (await hybrid.search(scope, queries[0], limit=10))[1] == "hybrid"
    store_tool = next(t for t in memory_toolset(hybrid).static_tools or () if t.name == "store")
    stored = 300
    t = time.perf_counter()
    for _ in range(stored):
        await store_tool.run(store_tool.validate({"content": sentence(rng)}), ctx)
    store_rate = stored / (time.perf_counter() - t)
    t = time.perf_counter()
    await hybrid.search(scope, queries[0], limit=10)  # after writes: the cache appends the new rows
    append_ms = (time.perf_counter() - t) * 1000
    print(f"{n:,} memories (384-d vectors) in SQLite; medians of {runs} queries")
    print(f"  load: {n / load_s:,.0f} memories/s in 5,000-row imports ({load_s:.1f} s)")
    print(f"  discover, keyword only (FTS5 BM25)      {median_ms(kw):7.1f} ms")
    print(f"  discover, hybrid (FTS5 + vectors, RRF)  {median_ms(hy):7.1f} ms   (target ≤ 20 ms)")
    print(f"    first hybrid query (loads the vector cache)  {cold_s * 1000:7.1f} ms")
    print(f"    first hybrid query after {stored} writes (appends)  {append_ms:7.1f} ms")
    print(f"  context build per turn (<memory> + <graph_context>), keyword only  p50 {median_ms(notes):5.1f} ms  "
          f"p99 {p99_ms(notes):5.1f} ms   (target ≤ 5 ms p50, ≤ 15 ms p99)")
    print(f"  context build per turn, hybrid                                p50 {median_ms(hybrid_notes):5.1f} ms  "
          f"p99 {p99_ms(hybrid_notes):5.1f} ms")
    ids, matrix = await records.search.vectors(scope)
    scan = [await seconds(asyncio.to_thread(matrix.__matmul__, matrix[0])) for _ in range(runs)]
    print(f"    the floor of hybrid: one exact scan of the {len(ids):,} vectors   {median_ms(scan):5.1f} ms")
    print(f"  store through the tool (with a vector)  {store_rate:7.0f} memories/s")
    await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(main(args.n, args.runs))

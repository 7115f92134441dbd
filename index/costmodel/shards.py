"""The cost model of a sharded index (issue 14): which partitioning is cheaper for a radius and a
skew, and where the fan-out over N shards overtakes the bucket lookups themselves.

Notation: Q bits, radius r, N shards, ``C(Q, <=r) = sum_{i<=r} C(Q, i)`` probes of one ball,
``t0`` ns per probe (the calibrated per-probe cost, docs/cost-model.md), ``m`` items per query
returned, ``t_item`` ns per returned item, ``hop_ns`` the latency of one shard round trip (in
parallel over the shards), ``fanout_ns`` the ingress's serial cost per shard contacted
(submitting the call, fetching and merging its answer).

* **id_hash** (an item's shard is a hash of its id): every query goes to every shard and every
  shard probes the whole ball over ``1/N`` of the items::

      probes = N * C(Q, <=r)                        (all shards)
      shard work per query  = t0 C(Q, <=r) + t_item m / N      (every shard, balanced)
      latency = hop_ns + N fanout_ns + t0 C(Q, <=r) + t_item m / N

* **code_prefix** (the first ``P = log2 N`` bits pick the shard; a shard at prefix distance
  ``d`` from the query searches its ``(Q-P)``-bit codes to radius ``r - d``)::

      probes = sum_{d<=min(r,P)} C(P, d) C(Q-P, <=r-d) = C(Q, <=r)   (split exactly)
      shards contacted = sum_{d<=min(r,P)} C(P, d)
      latency = hop_ns + contacted fanout_ns + t0 C(Q-P, <=r) + t_item m

  Over a batch of uniform queries every shard does ``1/N`` of the probes; with skew ``s`` (the
  fraction of the queries, and of the items they find, whose prefix is the hottest shard's:
  ``1/N`` uniform, 1 when every code shares one prefix) the hottest shard does about ``s`` of
  the ball's heavy part, and a batch takes as long as the hottest shard.

Counts are Python ints (exact; ``C(64, <=32)`` passes int64).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import comb


def ball(bits: int, radius: int) -> int:
    """``C(Q, <=r)``: probes of one radius-r ball (0 for r < 0)."""
    return sum(comb(bits, i) for i in range(0, min(radius, bits) + 1)) if radius >= 0 else 0


def prefix_width(shards: int) -> int:
    if shards < 2 or shards & (shards - 1):
        raise ValueError(f"code_prefix needs a power-of-two shard count >= 2, got {shards}")
    return shards.bit_length() - 1


def code_prefix_split(bits: int, radius: int, shards: int) -> list[dict]:
    """Per prefix distance d: ``{"d", "shards", "probes_each"}``; the shards at distance d from a
    query's prefix each probe ``C(Q-P, <=r-d)``."""
    p = prefix_width(shards)
    return [{"d": d, "shards": comb(p, d), "probes_each": ball(bits - p, radius - d)}
            for d in range(0, min(radius, p) + 1)]


def probes(bits: int, radius: int, shards: int, partitioning: str) -> int:
    """Probes of one query over all shards."""
    if partitioning == "id_hash":
        return shards * ball(bits, radius)
    if partitioning == "code_prefix":
        return sum(x["shards"] * x["probes_each"] for x in code_prefix_split(bits, radius, shards))
    raise ValueError(f"partitioning must be id_hash or code_prefix, got {partitioning!r}")


def contacted(bits: int, radius: int, shards: int, partitioning: str) -> int:
    """Shards one radius query is sent to."""
    if partitioning == "id_hash":
        return shards
    return sum(x["shards"] for x in code_prefix_split(bits, radius, shards))


@dataclass(frozen=True)
class ShardCosts:
    """Measured constants (ns): per probe, per returned item, one round trip, per shard fanned."""

    t0_ns: float
    hop_ns: float
    fanout_ns: float
    t_item_ns: float = 0.0


def latency_ns(bits: int, radius: int, shards: int, partitioning: str, costs: ShardCosts,
               items: float = 0.0) -> float:
    """Predicted wall time of one query (the slowest shard's lookups, plus the hop and the
    serial fan-out)."""
    n_contacted = contacted(bits, radius, shards, partitioning)
    if partitioning == "id_hash":
        work = costs.t0_ns * ball(bits, radius) + costs.t_item_ns * items / shards
    else:
        work = costs.t0_ns * ball(bits - prefix_width(shards), radius) + costs.t_item_ns * items
    return costs.hop_ns + n_contacted * costs.fanout_ns + work


def batch_ns(bits: int, radius: int, shards: int, partitioning: str, costs: ShardCosts,
             nq: int, items: float = 0.0, skew: float | None = None) -> float:
    """Predicted wall time of a batch of ``nq`` queries, the shards working in parallel (one
    core each): the busiest shard's work, plus one hop and the fan-out of every shard call.
    ``skew``: the hottest prefix's share of the queries and items (default uniform, 1/N)."""
    if partitioning == "id_hash":
        busiest = nq * (costs.t0_ns * ball(bits, radius) + costs.t_item_ns * items / shards)
    else:
        s = 1.0 / shards if skew is None else max(float(skew), 1.0 / shards)
        total = nq * (costs.t0_ns * ball(bits, radius) + costs.t_item_ns * items)
        busiest = s * total
    n_contacted = shards if partitioning == "id_hash" else \
        min(shards, nq * contacted(bits, radius, shards, partitioning))
    return costs.hop_ns + n_contacted * costs.fanout_ns + busiest


def choose(bits: int, radius: int, shards: int, costs: ShardCosts, nq: int = 1,
           items: float = 0.0, skew: float | None = None) -> dict:
    """The cheaper partitioning for this radius and skew: ``{"choice", "id_hash_ns",
    "code_prefix_ns", "probes": {...}}`` (code_prefix only for a power-of-two N)."""
    out = {"id_hash_ns": batch_ns(bits, radius, shards, "id_hash", costs, nq, items),
           "probes": {"id_hash": probes(bits, radius, shards, "id_hash")}}
    if shards >= 2 and not shards & (shards - 1):
        out["code_prefix_ns"] = batch_ns(bits, radius, shards, "code_prefix", costs, nq, items,
                                         skew)
        out["probes"]["code_prefix"] = probes(bits, radius, shards, "code_prefix")
    else:
        out["code_prefix_ns"] = None
    cp = out["code_prefix_ns"]
    out["choice"] = "code_prefix" if cp is not None and cp < out["id_hash_ns"] else "id_hash"
    return out


def fanout_crossover(bits: int, radius: int, costs: ShardCosts, partitioning: str,
                     max_shards: int = 1 << 12) -> int | None:
    """The smallest N (power of two for code_prefix) at which one query's serial fan-out
    ``contacted x fanout_ns`` exceeds its slowest shard's lookup time; None below
    ``max_shards``."""
    n = 2
    while n <= max_shards:
        n_c = contacted(bits, radius, n, partitioning)
        look = costs.t0_ns * (ball(bits, radius) if partitioning == "id_hash"
                              else ball(bits - prefix_width(n), radius))
        if n_c * costs.fanout_ns > look:
            return n
        n = n + 1 if partitioning == "id_hash" else 2 * n
    return None


def id_hash_break_even_items(bits: int, radius: int, shards: int, costs: ShardCosts,
                             skew: float, t_item_ns: float) -> float | None:
    """Items per query beyond which id_hash's batch is cheaper than code_prefix's at ``skew``
    (per-item cost ``t_item_ns``): from ``t0 B + t m / N < s (t0 B + t m)``, i.e.
    ``m > (1 - s) t0 B / (t (s - 1/N))``; None when code_prefix stays cheaper (s <= 1/N)."""
    s = max(float(skew), 1.0 / shards)
    if s - 1.0 / shards <= 0 or t_item_ns <= 0:
        return None
    return (1.0 - s) * costs.t0_ns * ball(bits, radius) / (t_item_ns * (s - 1.0 / shards))

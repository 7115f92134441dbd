"""k-NN by multi-index hashing for one-word codes: Norouzi, Punjani & Fleet's incremental
search ("Fast exact search in Hamming space with multi-index hashing", TPAMI 2014, sec. 4.2)
over the tables of :class:`~bucketsearch.index.mih.MultiIndex`.

Radius steps ``R = 0, 1, 2, ...``: step ``R`` probes substring table ``j = R mod m`` at
substring radius ``s = floor(R/m)`` (every key at Hamming distance exactly ``s`` from the
query's substring ``j``, enumerated as the ``C(w_j, s)`` flip masks of ``s`` bits). Pigeonhole
bound: after step ``R`` every item not met yet has ``d_j > floor((R - j) / m)`` on every
substring, so ``d = sum_j d_j >= R + 1``. The search keeps the ``k`` best ``(distance, id)``
met so far and stops after the first step ``R`` at which it holds ``k`` of them with the k-th
distance ``<= R`` (every item tied with the k-th is then known too, so the tie order by id is
exact), or at ``max_radius``.

Candidates are read through the substring tables' positions (:mod:`index.mih_tables`: a
probe is :func:`~bucketsearch.index.mih_tables.bucket` written out, a hashed table's bucket
ending at its end bit, the bucket's items ``words[positions[t]]``, their ids read only for an
item that enters the top-k), except table 0's: its bucket ``lo:hi`` is the rows ``lo:hi`` of
the (code, id)-sorted items, read in row order (codes and ids in sequence, no position). An
entry's tag (:mod:`index.mih_tables`) bounds its item's distance from below by ``s +
popcount(tag XOR the query's tag)``: past the k-th distance held (or ``max_radius``), the
item's code is not read (not with statistics, which count every candidate's first visit). An
item met in several tables is deduplicated at insertion into the top-k (sorted by (distance,
id), a copy is the entry just before its insertion point); one evicted from the top-k would be
rejected again; so the order in which candidates come does not change the answer. No visit
bits.

Memory-level parallelism (no effect on results or statistics): the first ``m`` steps probe one
bucket each (``s = 0``); the first :data:`FIRST_STEPS` of them are looked up together at step 0
with their first candidates prefetched, where one step after the other waited for its own
chain of loads (bucket start or filter, slot, the confirming code, end bits; positions;
codes); the next two queries' first lookups
are brought into the caches ahead (query ``qi + 2``'s bucket starts or filter words and home
slots, query ``qi + 1``'s first positions). Within a block of :data:`SPAN_BLOCK` probes: the
bucket starts (direct) or filter words (hashed) prefetched before the lookups; every
bucket's first :data:`PREFETCH_ITEMS` positions prefetched after them, and their codes
:data:`AHEAD_BUCKETS` buckets ahead of the one verified (its positions there by then); a
bucket's later codes :data:`PREFETCH_ITEMS` candidates ahead of the one verified. A far query
(thousands of probes, ~1 item a bucket at 10M uniform codes) waited for each of these loads
in turn; a random k = 1 query at 10M went from 1.30x to 1.00x of the old layout's copies.

When a step would push the query over ``max_probes`` probes, or would probe more keys than
there are items, the query verifies every item instead (``words``, ``ids``: a scan, exact) and
``scanned_from`` records the step, as :func:`bucketsearch.index.mih._mih_kernel` does.

A time budget (``budget_ticks`` of :func:`~bucketsearch.index._jit.cycle_counter`, checked
after every block of :data:`SPAN_BLOCK` probes and their candidates and after every step)
gives a query up: it returns no result and ``scanned_from = DEFERRED``, for the caller to
answer by the blocked scan of :mod:`index.scan` with the other queries given up
(:func:`knn_search`). A query far from every item (the k-th neighbour of a uniform 2M set
lies at distance 13-17, where the pigeonhole bound makes ~10% of the items candidates, each a
random read) then costs the scan's share of a pass plus at most the budget (and one block).
The budget is time, not a model of it: a modeled budget (ns per probe and per candidate,
fitted on near queries) let random queries run 2-5x past it (probes that miss the caches,
top-k insertions while fewer than k are held). But a query is given up only once its modeled
work (``probe_ns x probes + candidate_ns x candidates``) has passed ``min_work_ns`` too: a
light query preempted on a loaded machine (its time inflated, not its work) goes on.

Statistics per step ``R`` (as :func:`bucketsearch.index.mih._mih_kernel`'s, ``(7, nq, max_radius +
1)``): probes, non-empty / empty buckets, items (results at distance exactly ``R``), lookup_ns,
candidates (bucket entries read) and unique_candidates (first visits: no earlier step's table
holds the item within its radius, tested by the substring distances, only with statistics).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index._jit import (ctz64, cycle_counter, monotonic_ns, njit, ns_per_tick,
                                     popcount64, prefetch)
from bucketsearch.index.base import SearchStats, run_chunked, splice_rows, stats_from_chunks
from bucketsearch.index.kernels import (CANDIDATES, EMPTY, ITEMS, LOOKUP_NS, NONEMPTY, PROBES,
                                        UNIQUE_CANDIDATES, chunk_result)
from bucketsearch.index.item_table import filter_word_bits, home_and_fingerprint
from bucketsearch.index.mih_tables import (T_BASE, T_BITMAP, T_BITMAP_WORDS, T_DIRECT, T_FP_BITS,
                                           T_MASK, T_ROW_BITS, T_SHIFT, T_SLOTS, code_tag,
                                           entry_row, row_mask, tag_distance)
from bucketsearch.index.table import HASH_MULTIPLIER
#: Probes whose bucket ranges are looked up before their items are verified (pass 1, 2)
SPAN_BLOCK = 64
#: Candidates per bucket whose position and code are prefetched between pass 1 and pass 2
PREFETCH_ITEMS = 8
#: Buckets ahead of the one verified whose first codes are prefetched (their positions were)
AHEAD_BUCKETS = 8
#: Steps whose one probe each (s = 0) is looked up at step 0, their first candidates prefetched
#: together: a query not answered by exact copies runs at least two (k = 1 near queries stop
#: there); more than two measured slower at 1M (lookups of steps not run)
FIRST_STEPS = 2
#: ``scanned_from`` of a query given up past its time budget (no result: the caller scans it)
DEFERRED = -2
#: the budget (cycle-counter ticks) of a search without one
NO_BUDGET = np.iinfo(np.int64).max


@njit(inline="always")
def _offer(td, ti, filled, d, v):
    """Insert ``(d, v)`` into the sorted top-k ``td, ti`` (``filled`` entries, capacity
    ``len(td)``) unless it is a copy of an entry or not better than the k-th. Returns the new
    ``filled``."""
    k = len(td)
    if filled == k and (d > td[k - 1] or (d == td[k - 1] and v >= ti[k - 1])):
        return filled
    p = filled
    while p > 0 and (td[p - 1] > d or (td[p - 1] == d and ti[p - 1] > v)):
        p -= 1
    if p > 0 and td[p - 1] == d and ti[p - 1] == v:
        return filled  # met in an earlier table
    last = filled if filled < k else k - 1
    for c in range(last, p, -1):
        td[c] = td[c - 1]
        ti[c] = ti[c - 1]
    td[p] = d
    ti[p] = v
    return filled + 1 if filled < k else k


@njit
def _mih_knn_kernel(xq, k, max_radius, widths, step_probes, max_probes, with_stats, tables,
                    starts, slots, bitmap, positions, ends, words, ids, word_width, budget_ticks,
                    probe_ns, candidate_ns, min_work_ns):
    """The ``k`` nearest items within ``max_radius`` of every query (one-word codes) by the
    incremental multi-index search of the module docstring. Returns :func:`chunk_result`'s
    tuple: CSR counts, D, I ordered by (distance, id), statistics ``(7, nq, max_radius + 1)``,
    radii (steps run), total_ns, scanned_from and the results counted. A query that has run
    ``budget_ticks`` cycle-counter ticks at a check (the module docstring), its modeled work
    past ``min_work_ns``, and is not done is given up (``scanned_from = DEFERRED``, no result;
    its statistics up to then)."""
    nq = xq.shape[0]
    m = len(widths)
    n = len(ids)
    width = max_radius + 1
    counts = np.zeros(nq, dtype=np.int64)
    stats = np.zeros((UNIQUE_CANDIDATES + 1, nq if with_stats else 0, width), dtype=np.int64)
    radii = np.zeros(nq, dtype=np.int64)
    total_ns = np.zeros(nq, dtype=np.int64)
    scanned_from = np.full(nq, -1, dtype=np.int64)
    out_d = np.empty(nq * min(k, n), dtype=np.int32)
    out_i = np.empty(nq * min(k, n), dtype=np.int64)
    td = np.empty(min(k, n) if n > 0 else 1, dtype=np.int32)
    ti = np.empty(len(td), dtype=np.int64)
    kk = len(td)
    # a block's probe keys, and its non-empty buckets (positions lo:hi; the first
    # block of a query keeps one per table, empty or not, each step's)
    n_pre = min(FIRST_STEPS, m, width)  # steps 0 .. n_pre - 1: looked up at step 0
    block = max(SPAN_BLOCK, n_pre)
    spans = np.empty(2 * block, dtype=np.int64)
    span_keys = np.empty(block, dtype=np.uint64)
    sub_shift = np.empty(m, dtype=np.uint64)
    sub_mask = np.empty(m, dtype=np.uint64)
    end_base = np.zeros(m, dtype=np.int64)  # table j's first end bit (ends_bit_base)
    rmask = row_mask(tables)
    rb = np.uint64(tables[0, T_ROW_BITS])
    eb = 0
    for j in range(m):
        sub_shift[j] = np.uint64(tables[j, T_SHIFT])
        sub_mask[j] = np.uint64(tables[j, T_MASK])
        end_base[j] = eb
        if not tables[j, T_DIRECT]:
            eb += 64 * ((n + 63) // 64)
    n_out = 0
    for qi in range(nq):
        t_query = monotonic_ns() if with_stats else 0
        q = xq[qi, 0]
        filled = 0
        # an item enters the top-k when (d, id) < (bound, bound_id): within max_radius
        # (any id) until k are held, then before the k-th
        bound = max_radius
        bound_id = np.int64(0)
        spent = 0
        last = -1
        # the next queries' first lookups ahead (a batch's queries overlap their chains of
        # dependent loads): query qi + 2's bucket start (direct) or filter word and home
        # slot (hashed) of every table brought into the caches, query qi + 1's (there since
        # the query before) read and the first positions of its buckets brought in
        for ahead in range(2, 0, -1):
            if qi + ahead >= nq or n == 0:
                continue
            qa = xq[qi + ahead, 0]
            for jj in range(n_pre):
                key = (qa >> sub_shift[jj]) & sub_mask[jj]
                if tables[jj, T_DIRECT]:
                    sd = tables[jj, T_BASE] + np.int64(key)
                    if ahead == 2:
                        prefetch(starts, sd)
                    elif jj == 0:
                        prefetch(words, np.int64(starts[sd]))
                    else:
                        prefetch(positions, jj * n + np.int64(starts[sd]))
                    continue
                h = key * HASH_MULTIPLIER
                f, fbits = filter_word_bits(h, tables[jj, T_BITMAP_WORDS])
                fpb = np.uint64(tables[jj, T_FP_BITS])
                sl, fp = home_and_fingerprint(h, np.uint64(tables[jj, T_SLOTS]), fpb)
                sl = tables[jj, T_BASE] + np.int64(sl)
                if ahead == 2:
                    prefetch(bitmap, tables[jj, T_BITMAP] + np.int64(f))
                    prefetch(slots, sl)
                elif bitmap[tables[jj, T_BITMAP] + np.int64(f)] & fbits == fbits:
                    e = np.uint64(slots[sl])
                    if e != np.uint64(0) and e & ((np.uint64(1) << fpb) - np.uint64(1)) == fp:
                        cand = np.int64(e >> fpb) - 1
                        if jj == 0:
                            prefetch(words, cand)
                        else:
                            prefetch(positions, jj * n + cand)
        timed = budget_ticks != NO_BUDGET  # no cycle counter read without a budget
        t_start = cycle_counter() if timed else 0
        q_work = 0.0  # modeled ns of the steps before this one
        deferred = False
        for R in range(width):
            if n == 0:
                break
            j = R % m
            s = R // m
            t0 = monotonic_ns() if with_stats else 0
            last = R
            if spent + step_probes[R] > max_probes or step_probes[R] > n:
                # verify every item (exact); the top-k drops the copies of items met before
                scanned_from[qi] = R
                for p in range(n):
                    d = popcount64(q ^ words[p, 0])
                    if d < bound or (d == bound and (filled < kk or ids[p] < bound_id)):
                        filled = _offer(td, ti, filled, d, ids[p])
                        if filled == kk:
                            bound = td[kk - 1]
                            bound_id = ti[kk - 1]
                last = max_radius
                break
            if s > widths[j]:
                continue
            spent += step_probes[R]
            key0 = (q >> sub_shift[j]) & sub_mask[j]
            probes = 0
            nonempty = 0
            cands = 0
            unique = 0
            # flip masks of s bits within w_j bits, in increasing order (Gosper's hack)
            mask = (np.uint64(1) << np.uint64(s)) - np.uint64(1)
            top = sub_mask[j]
            done = False
            while not done:
                # the block's probes: at step 0 the first probe of each of the first n_pre
                # steps (tables 0 .. n_pre - 1's own substrings: their lookups and first
                # candidates overlap, where one step after the other waited for each in
                # turn); steps 1 .. n_pre - 1 verify theirs; later steps up to SPAN_BLOCK of
                # their flips (one at s = 0)
                b0 = 0
                nk = 0
                if R < n_pre:
                    b0 = R
                    done = True
                    probes += 1
                    if R == 0:
                        for jj in range(n_pre):
                            span_keys[jj] = (q >> sub_shift[jj]) & sub_mask[jj]
                        nk = n_pre
                else:
                    while nk < SPAN_BLOCK:
                        span_keys[nk] = key0 ^ mask
                        nk += 1
                        probes += 1
                        if s == 0:
                            done = True
                            break
                        # next mask with s bits set; done once it leaves the w_j low bits
                        # (the division by the lowest bit c, a shift by its index)
                        c = mask & (~mask + np.uint64(1))
                        r = mask + c
                        mask = (((r ^ mask) >> np.uint64(2)) >> np.uint64(ctz64(c))) | r
                        if mask > top or r == 0:
                            done = True
                            break
                if R == 0 or R >= n_pre:
                    # pass 1: the buckets of the block's probes (the lookups overlap), their
                    # bucket starts or filter words prefetched first (loads nothing waits for)
                    for bi in range(nk):
                        jb = bi if R == 0 else j
                        if tables[jb, T_DIRECT]:
                            prefetch(starts, tables[jb, T_BASE] + np.int64(span_keys[bi]))
                        else:
                            f, fbits = filter_word_bits(span_keys[bi] * HASH_MULTIPLIER,
                                                        tables[jb, T_BITMAP_WORDS])
                            prefetch(bitmap, tables[jb, T_BITMAP] + np.int64(f))
                    nb = 0
                    for bi in range(nk):
                        jb = bi if R == 0 else j
                        key = span_keys[bi]
                        lo = 0
                        hi = 0
                        if tables[jb, T_DIRECT]:  # written out: a helper taking the arrays
                            sd = tables[jb, T_BASE] + np.int64(key)  # refcounts them per call
                            lo = np.int64(starts[sd])
                            hi = np.int64(starts[sd + 1])
                        else:  # hashed: mih_tables.bucket, its end from the end bits
                            h = key * HASH_MULTIPLIER
                            f, fbits = filter_word_bits(h, tables[jb, T_BITMAP_WORDS])
                            if bitmap[tables[jb, T_BITMAP] + np.int64(f)] & fbits == fbits:
                                sb = tables[jb, T_BASE]
                                n_slots = np.uint64(tables[jb, T_SLOTS])
                                fpb = np.uint64(tables[jb, T_FP_BITS])
                                sl, fp = home_and_fingerprint(h, n_slots, fpb)
                                fp_mask = (np.uint64(1) << fpb) - np.uint64(1)
                                while True:
                                    e = np.uint64(slots[sb + np.int64(sl)])
                                    if e == np.uint64(0):
                                        break
                                    if (e & fp_mask) == fp:
                                        cand = np.int64(e >> fpb) - 1
                                        # the bucket's end: the next end bit (next_end)
                                        g = end_base[jb] + cand
                                        wi = g >> 6
                                        bits = ends[wi] >> np.uint64(g & 63)
                                        pc = cand if jb == 0 else entry_row(
                                            positions, jb * n + cand, rmask)  # table 0: rows
                                        if (words[pc, 0] >> sub_shift[jb]) & sub_mask[jb] \
                                                == key:
                                            if bits == np.uint64(0):
                                                wi += 1
                                                while ends[wi] == np.uint64(0):
                                                    wi += 1
                                                g = wi << 6
                                                bits = ends[wi]
                                            lo = cand
                                            hi = g + np.int64(ctz64(bits)) - end_base[jb] + 1
                                            break
                                    sl += np.uint64(1)
                                    if sl == n_slots:
                                        sl = np.uint64(0)
                        if hi > lo or R == 0:  # the first pass keeps one per step
                            spans[2 * nb] = jb * n + lo
                            spans[2 * nb + 1] = jb * n + hi
                            nb += 1
                    nk = nb
                    # pass 1b: the first candidates of every bucket brought into the caches,
                    # their positions then their codes (loads that depend on one another, all
                    # issued before any is waited for: a candidate's code is a random read);
                    # table 0's buckets are rows (module docstring): their codes and ids
                    for bi in range(nk):
                        rows = (bi if R == 0 else j) == 0
                        for t in range(spans[2 * bi], min(spans[2 * bi + 1],
                                                          spans[2 * bi] + PREFETCH_ITEMS)):
                            if rows:
                                prefetch(words, t)
                                prefetch(ids, t)
                            else:
                                prefetch(positions, t)
                    # (the codes of the first AHEAD_BUCKETS buckets; the others' from pass 2,
                    # that many buckets ahead, their positions there by then)
                    for bi in range(min(nk, AHEAD_BUCKETS)):
                        if (bi if R == 0 else j) == 0:
                            continue
                        for t in range(spans[2 * bi], min(spans[2 * bi + 1],
                                                          spans[2 * bi] + PREFETCH_ITEMS)):
                            prefetch(words, entry_row(positions, t, rmask))
                # pass 2: verify the items of this step's buckets (table 0's in row order)
                rows = j == 0
                qtag = code_tag(q, j, tables)
                b1 = R + 1 if R < n_pre else nk
                for bi in range(b0, b1):
                    lo = spans[2 * bi]
                    hi = spans[2 * bi + 1]
                    ba = bi + AHEAD_BUCKETS
                    if ba < b1 and not rows:
                        for t in range(spans[2 * ba], min(spans[2 * ba + 1],
                                                          spans[2 * ba] + PREFETCH_ITEMS)):
                            prefetch(words, entry_row(positions, t, rmask))
                    if hi > lo:
                        nonempty += 1
                    cands += hi - lo
                    for t in range(lo, hi):
                        if rows:
                            p = np.uint64(t)  # unsigned: no wraparound test
                        else:
                            if t + PREFETCH_ITEMS < hi:  # the bucket's later codes, ahead
                                prefetch(words, entry_row(positions, t + PREFETCH_ITEMS, rmask))
                            e = np.uint64(positions[t])
                            # the tag filter (not with statistics, which count every code):
                            # d >= s + the tag's differing bits; past the k-th, not read
                            if not with_stats and \
                                    s + tag_distance(e, rb, qtag) > bound:
                                continue
                            p = e & rmask
                        diff = q ^ words[p, 0]
                        d = popcount64(diff)
                        if with_stats:
                            # first visit: met at step min_jj (m d_jj + jj), this one
                            first = 1
                            for jj in range(m):
                                if m * popcount64((diff >> sub_shift[jj]) & sub_mask[jj]) \
                                        + jj < R:
                                    first = 0
                            unique += first
                        # the test against the k-th inline, _offer (its array arguments
                        # refcounted at every call) only for an item that enters
                        if d < bound or (d == bound and (filled < kk
                                                         or ids[p] < bound_id)):
                            filled = _offer(td, ti, filled, d, ids[p])
                            if filled == kk:
                                bound = td[kk - 1]
                                bound_id = ti[kk - 1]
                if not done and timed and cycle_counter() - t_start > budget_ticks and \
                        q_work + probe_ns * probes + candidate_ns * cands > min_work_ns:
                    deferred = True
                    break
            if with_stats:
                stats[PROBES, qi, R] = probes
                stats[NONEMPTY, qi, R] = nonempty
                stats[EMPTY, qi, R] = probes - nonempty
                stats[CANDIDATES, qi, R] = cands
                stats[UNIQUE_CANDIDATES, qi, R] = unique
                stats[LOOKUP_NS, qi, R] = monotonic_ns() - t0
            if deferred:
                break  # given up inside the step: it is not complete
            if filled == kk and td[kk - 1] <= R:
                break  # every unseen item is at distance >= R + 1 > the k-th
            q_work += probe_ns * probes + candidate_ns * cands
            if timed and cycle_counter() - t_start > budget_ticks and q_work > min_work_ns:
                deferred = True
                break
        radii[qi] = last + 1
        if deferred:
            scanned_from[qi] = DEFERRED
            filled = 0
        for c in range(filled):
            out_d[n_out + c] = td[c]
            out_i[n_out + c] = ti[c]
            if with_stats and td[c] < width:
                stats[ITEMS, qi, td[c]] += 1
        n_out += filled
        counts[qi] = filled
        if with_stats:
            total_ns[qi] = monotonic_ns() - t_query
    return chunk_result(counts, out_d, out_i, n_out, stats, radii, total_ns, scanned_from, -1)


def knn_search(mih, xq, k, stats, max_radius, budget_ns=None, scan=None, info=None,
               work_coef=(0.0, 0.0), min_work_ns=0.0):
    """k-NN of ``xq`` by :func:`_mih_knn_kernel` over the tables of ``mih`` (a
    :class:`~bucketsearch.index.mih.MultiIndex` of one-word codes), in query chunks on its
    threads. ``budget_ns``: the time budget of each query (none when None; 0 gives every
    query up after its first block), given up only past ``min_work_ns`` of modeled work too
    (``work_coef``: ns per probe, per candidate); the queries given up are answered together
    by ``scan`` (a :class:`~bucketsearch.index.scan.LinearScan` over the same items: its
    blocked k-NN) and spliced into the results, their statistics the scan's (``engine`` scan), their
    ``total_ns`` counting the multi-index work given up; ``info["deferred"]`` (a dict given)
    counts them. Returns ``(lims, D, I)`` and with ``stats`` the
    :class:`~bucketsearch.index.base.SearchStats`."""
    t = mih.tables
    ticks = NO_BUDGET if budget_ns is None else min(int(budget_ns / ns_per_tick()), NO_BUDGET)
    args = (k, max_radius, mih.sub_widths, mih._step_array(max_radius), mih.max_probes,
            bool(stats), t.tables, t.starts, t.slots, t.bitmap, t.positions, t.ends, mih.words,
            mih.ids, mih._word_width, ticks, float(work_coef[0]), float(work_coef[1]),
            float(min_work_ns))
    lims, D, I, rest = run_chunked(lambda chunk: _mih_knn_kernel(chunk, *args), xq,
                                   mih.threads)
    st = mih._tagged(stats_from_chunks(rest), k) if stats else None
    if info is not None:
        info["deferred"] = 0
    if budget_ns is not None:
        scanned_from = np.concatenate([r[3] for r in rest])
        rows = np.flatnonzero(scanned_from == DEFERRED)
        if info is not None:
            info["deferred"] = len(rows)
        if len(rows):
            if scan is None:
                raise ValueError("a work budget needs the scan that answers the queries "
                                 "given up")
            out = scan._knn_csr(xq[rows], k, stats, max_radius)
            lims, D, I = splice_rows(lims, D, I, rows, *out[:3])
            if stats:
                st_scan = out[3]
                st_scan.total_ns = st_scan.total_ns + st.total_ns[rows]
                keep = np.flatnonzero(scanned_from != DEFERRED)
                order = np.argsort(np.concatenate([keep, rows]), kind="stable")
                st = SearchStats.concat([st.rows(keep), st_scan]).rows(order)
    return (lims, D, I, st) if stats else (lims, D, I)

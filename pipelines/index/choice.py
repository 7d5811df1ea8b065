"""Which FAISS index a language gets, from how many sentences it has, and what it costs a sentence.

The table starts from stopes (NLLB's miner, `stopes/utils/mining_utils.py`): exact search below
10,000 sentences (clustering fails with so few points), then IVF product quantisation with the
number of inverted lists growing with the language. We cap the IVF list count so that every list
gets at least `MIN_TRAINING_POINTS_PER_LIST` training vectors from the sample, and we use
OPQ32,...,PQ32 below a million sentences (a small index trains faster; 32-byte codes).

Above a million sentences the codes are fast-scan PQ (`PQ128x4fs`: 128 four-bit codes, 64 bytes,
scanned with SIMD lookup tables, several times faster a code than 8-bit PQ64 at the same bytes
and a better first-64 shortlist for the exact re-ranking labse-mine does), and from 100 million
the coarse quantiser is an HNSW graph (`_HNSW32`), whose cost grows with log nlist where a flat
one compares every centroid (BENCHMARKS.md, "Global mining under the goal"). Fast-scan stores a
list in blocks of 32 codes, so the list counts keep lists at >= ~250 codes (padding <= ~4 bytes a
sentence).

Bytes a sentence, as held in memory and on disk: an IVF-PQ index stores the PQ code (64 bytes for
PQ128x4fs or PQ64, 32 for PQ32) and a 64-bit id per vector: 72 bytes a sentence (the goal is <= 80)
plus the shared coarse quantiser (nlist x dim x 4 bytes, once per shard). A flat index stores the
float32 vector: 4 x dim bytes (1,024 at 256 dimensions), fine only below the table's first row.
"""
from __future__ import annotations

import re

# (more than this many sentences, factory): the first row that matches wins
SIZE_TABLE: tuple[tuple[int, str], ...] = (
    (500_000_000, "IVF262144_HNSW32,PQ128x4fs"),
    (100_000_000, "IVF131072_HNSW32,PQ128x4fs"),
    (20_000_000, "IVF65536,PQ128x4fs"),
    (5_000_000, "IVF16384,PQ128x4fs"),
    (1_000_000, "IVF4096,PQ128x4fs"),
    (250_000, "OPQ32,IVF8192,PQ32"),
    (80_000, "OPQ32,IVF2048,PQ32"),
    (10_000, "OPQ32,IVF512,PQ32"),
)
FLAT = "Flat"
MIN_TRAINING_POINTS_PER_LIST = 39  # FAISS warns below this many k-means points per centroid
ID_BYTES = 8  # FAISS stores a 64-bit id per vector in every inverted list


def factory_for(sentences: int) -> str:
    """The factory string for a language with `sentences` vectors (the size table)."""
    for above, factory in SIZE_TABLE:
        if sentences > above:
            return factory
    return FLAT


def ivf_lists(factory: str) -> int | None:
    found = re.search(r"IVF(\d+)", factory)
    return int(found.group(1)) if found else None


def pq_bytes(factory: str) -> int | None:
    """Bytes of one PQ code (PQ<M> with 8 bits a sub-quantiser: M bytes), None without PQ."""
    found = re.search(r"PQ(\d+)(?:x(\d+))?(?:fs)?$", factory.replace(" ", ""))
    if not found:
        return None
    bits = int(found.group(2) or 8)
    return (int(found.group(1)) * bits + 7) // 8


def fitted_factory(factory: str, training_vectors: int) -> str:
    """`factory` with its IVF list count lowered so that each list has enough training points
    (a sample of `training_vectors`); unchanged when it has no IVF or already fits."""
    lists = ivf_lists(factory)
    if lists is None:
        return factory
    largest = max(1, training_vectors // MIN_TRAINING_POINTS_PER_LIST)
    if lists <= largest:
        return factory
    fitted = 1 << (largest.bit_length() - 1)  # a power of two, like the table's
    return re.sub(r"IVF\d+", f"IVF{fitted}", factory, count=1)


def training_points_needed(index) -> tuple[int, str]:
    """(the fewest training vectors FAISS can train the untrained FAISS `index` on, what needs
    them): every k-means needs a point a centroid (IVF lists, 2^bits a PQ sub-quantiser), and an
    OPQ or PCA transform at least as many points as dimensions (FAISS 1.15 crashes the process
    below that instead of raising)."""
    import faiss

    needs = [(1, "")]
    outer = faiss.downcast_index(index)
    if isinstance(outer, faiss.IndexPreTransform):
        for step in range(outer.chain.size()):
            transform = faiss.downcast_VectorTransform(outer.chain.at(step))
            if isinstance(transform, faiss.OPQMatrix):
                needs.append((max(transform.d_in, 256), f"the OPQ rotation of {transform.d_in} dimensions"))
            elif isinstance(transform, faiss.PCAMatrix):
                needs.append((transform.d_in, f"the PCA of {transform.d_in} dimensions"))
        outer = faiss.downcast_index(outer.index)
    try:
        needs.append((faiss.extract_index_ivf(outer).nlist, "the IVF lists"))
    except RuntimeError:
        pass
    quantiser = getattr(outer, "pq", None)
    if quantiser is not None:
        needs.append((quantiser.ksub, f"the PQ codebooks of {quantiser.ksub} centroids"))
    return max(needs)


def bytes_per_sentence(factory: str, dim: int) -> int:
    """What one added sentence costs the index (memory and disk), without the shared quantiser."""
    code = pq_bytes(factory)
    if code is not None:
        return code + (ID_BYTES if ivf_lists(factory) else 0)
    if factory.upper().startswith("FLAT") or ivf_lists(factory) is None:
        return 4 * dim
    return 4 * dim + ID_BYTES  # IVF<n>,Flat


def training_sample_size(sentences: int, factory: str, requested: int | None) -> int:
    """Vectors the index is trained on: `requested` if given, else enough for the IVF lists
    (100 a list, at least 50,000 when there are that many; stopes uses 40M at its largest),
    never more than there are."""
    if requested is not None:
        return min(requested, sentences)
    lists = ivf_lists(factory) or 0
    return min(sentences, max(50_000, 100 * lists))

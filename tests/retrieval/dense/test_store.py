"""The embedding store: shards written and read back block by block, ids looked up for the rows
asked, and every malformed shard refused with a one-line error naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpr_cache.errors import InputError
from dpr_cache.retrieval.dense.store import EmbeddingStore, Shard, ids_path, write_shard


def _write(tmp: Path, sizes=(7, 1, 12), dim=5, dtype="float16", seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((sum(sizes), dim)).astype(np.float32)
    start = 0
    for i, n in enumerate(sizes):
        ids = [f"id{j}" for j in range(start, start + n)]
        write_shard(tmp / f"part-{i}.npy", vectors[start : start + n], ids, dtype)
        start += n
    return vectors


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("block", [1, 3, 7, 100])
def test_blocks_cover_every_row_once_across_shards(tmp_path, dtype, block) -> None:
    vectors = _write(tmp_path, dtype=dtype)
    store = EmbeddingStore.from_glob(str(tmp_path / "*.npy"))
    assert (store.rows, store.dim, store.dtype) == (20, 5, np.dtype(dtype))
    got = np.zeros_like(vectors)
    seen = []
    for start, rows in store.blocks(block):
        assert rows.dtype == np.float32 and len(rows) <= block
        got[start : start + len(rows)] = rows
        seen += range(start, start + len(rows))
    assert seen == list(range(20))
    want = vectors.astype(np.float16).astype(np.float32) if dtype == "float16" else vectors
    np.testing.assert_array_equal(got, want)
    sample = np.array([19, 0, 7, 8, 3, 19, 12, 1])  # unsorted, repeated, across every shard
    np.testing.assert_array_equal(store.take(sample), want[sample])


def test_a_shard_subset_and_the_ids_of_given_rows(tmp_path) -> None:
    _write(tmp_path)
    store = EmbeddingStore.from_glob(str(tmp_path / "*.npy"))
    assert [s for s, _ in store.blocks(100, shards=[2])] == [8]
    ids = store.ids_of(np.array([[19, -1], [0, 7]]))
    assert ids.tolist() == [["id19", ""], ["id0", "id7"]]


def test_reads_are_plain_not_mapped(tmp_path) -> None:
    """A block is a reused buffer: the same array object comes back, filled anew."""
    _write(tmp_path, sizes=(4, 4))
    store = EmbeddingStore.from_glob(str(tmp_path / "*.npy"))
    buffers = {id(rows.base if rows.base is not None else rows) for _, rows in store.blocks(4)}
    assert len(buffers) == 1


def test_mismatched_shards_are_refused_by_name(tmp_path) -> None:
    _write(tmp_path, sizes=(3,), dim=5)
    write_shard(tmp_path / "wide.npy", np.zeros((2, 6)), ["a", "b"])
    with pytest.raises(InputError, match=r"wide\.npy: 6 x float16 vectors, but .*part-0\.npy"):
        EmbeddingStore.from_glob(str(tmp_path / "*.npy"))
    (tmp_path / "wide.npy").unlink()
    write_shard(tmp_path / "other.npy", np.zeros((2, 5)), ["a", "b"], "float32")
    with pytest.raises(InputError, match="same dimension and dtype"):
        EmbeddingStore.from_glob(str(tmp_path / "*.npy"))


def test_ids_must_match_the_rows(tmp_path) -> None:
    _write(tmp_path, sizes=(3,))
    npy = tmp_path / "part-0.npy"
    ids_path(npy).write_text("a\nb\n")
    with pytest.raises(InputError, match=r"part-0\.ids\.txt: 2 ids for the 3 rows"):
        EmbeddingStore.open([npy])
    ids_path(npy).unlink()
    with pytest.raises(InputError, match=r"part-0\.ids\.txt: missing"):
        EmbeddingStore.open([npy])


def test_bad_files_are_one_line_errors(tmp_path) -> None:
    with pytest.raises(InputError, match="no such shard"):
        Shard.open(tmp_path / "gone.npy")
    (tmp_path / "text.npy").write_text("not numpy")
    with pytest.raises(InputError, match=r"text\.npy: not a \.npy file"):
        Shard.open(tmp_path / "text.npy")
    np.save(tmp_path / "ints.npy", np.zeros((2, 3), np.int32))
    with pytest.raises(InputError, match="2-D float16/float32"):
        Shard.open(tmp_path / "ints.npy")
    np.save(tmp_path / "fortran.npy", np.asfortranarray(np.zeros((2, 3), np.float32)))
    with pytest.raises(InputError, match="Fortran order"):
        Shard.open(tmp_path / "fortran.npy")
    with pytest.raises(InputError, match="matches no .npy shard"):
        EmbeddingStore.from_glob(str(tmp_path / "none-*.npy"))


def test_a_truncated_shard_is_refused_when_opened(tmp_path) -> None:
    _write(tmp_path, sizes=(6,))
    npy = tmp_path / "part-0.npy"
    npy.write_bytes(npy.read_bytes()[:-10])
    with pytest.raises(InputError, match=r"part-0\.npy: truncated: \d+ bytes, its header says"):
        EmbeddingStore.open([npy])


def test_a_line_break_in_an_id_is_refused(tmp_path) -> None:
    with pytest.raises(InputError, match="line break"):
        write_shard(tmp_path / "x.npy", np.zeros((1, 2)), ["a\nb"])
    assert not list(tmp_path.iterdir())  # nothing half-written

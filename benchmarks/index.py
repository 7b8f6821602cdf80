"""Corpus encoding speed: ``encode_passage_texts`` (the ``index`` command's code) on the same
passages sorted by length against file order padded to max_length, after a one-batch warm-up::

    python -m benchmarks.index '{"model": "...", "passages": "data/squad/passages.tsv"}'
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch


def run_index_bench(
    model: str, passages, *, pooling="mean", max_length=256, batch_size=64, limit=None, threads=None
) -> dict:
    from dpr_cache.data.passages import read_passages
    from dpr_cache.data.tokenize import tokenize_passages
    from dpr_cache.model.biencoder import BiEncoder
    from dpr_cache.retrieval.dense.encode import encode_passage_texts

    if threads:
        torch.set_num_threads(threads)
    rows = list(read_passages(Path(passages)))[:limit]
    texts, titles = [r[1] for r in rows], [r[2] for r in rows]
    enc = BiEncoder.from_pretrained(model, shared=True, pooling=pooling).eval()
    kwargs = dict(max_length=max_length, batch_size=batch_size, device=torch.device("cpu"))
    encode_passage_texts(enc, titles[:batch_size], texts[:batch_size], **kwargs)  # warm-up
    result: dict = {"passages": len(texts), "max_length": max_length, "batch_size": batch_size}
    result["threads"] = torch.get_num_threads()
    embs = {}
    for name, sort in (("padded_s", False), ("sorted_s", True)):
        start = time.perf_counter()
        embs[name] = encode_passage_texts(enc, titles, texts, sort_by_length=sort, **kwargs)
        result[name] = time.perf_counter() - start
    result["speedup"] = result["padded_s"] / result["sorted_s"]
    result["max_abs_diff"] = float(np.abs(embs["padded_s"] - embs["sorted_s"]).max())
    ids = tokenize_passages(enc.tokenizer, titles, texts, max_length)["input_ids"]
    result["mean_tokens"] = sum(map(len, ids)) / len(ids)
    return result


if __name__ == "__main__":
    from dpr_cache.runtime.quiet import quiet_libraries

    quiet_libraries()
    print(json.dumps(run_index_bench(**json.loads(sys.argv[1]))), flush=True)

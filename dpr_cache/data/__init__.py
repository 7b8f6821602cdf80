"""DPR data formats in and out, the one tokenizer, and training batches.

- training.py: a training source (DPR's, or any layout) -> cached Arrow ``datasets.Dataset``
- records.py, layouts.py: rows of JSON Lines, Parquet, CSV, save_to_disk; their layouts as DPR's
- sources.py: several training sources joined, one id with two texts refused
- passages.py: DPR wiki passages TSV;  qas.py: DPR qas TSV/CSV for evaluation
- arrow_cache.py, files.py, ids.py: Arrow caches, (gzipped) input files, passage ids
- tokenize.py: the tokenization of questions, (title, text) passages and text pairs, used everywhere
- batches.py: per-epoch seeded batch indices and rank slices; one source a batch
- collate.py: a step's tokenized questions, passage groups and passage ids
- answers.py: DPR's answer matching
- squad.py: DPR-format files from SQuAD v1.1 dev;  download.py: DPR's NQ files
- synthetic.py: random token batches of exact lengths (benchmarks, memory probes)

Names below load their module on first use, so importing this package stays cheap.
"""

from typing import Any

_LAZY = {
    "load_training_set": "training",
    "iter_training_examples": "training",
    "read_passages": "passages",
    "load_passages": "passages",
    "read_qas": "qas",
    "TrainBatches": "batches",
    "Batch": "collate",
    "build_batch": "collate",
    "encode_questions": "tokenize",
    "encode_passages": "tokenize",
    "tokenize_questions": "tokenize",
    "tokenize_passages": "tokenize",
    "tokenize_text_pairs": "tokenize",
    "has_answer": "answers",
    "passage_hash": "ids",
    "build_squad": "squad",
    "download_nq": "download",
    "synthetic_batch": "synthetic",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The flags several commands share, typed once: their names, help and metavars."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpr_cache.runtime.memory import HEADROOM_GB

__all__ = [
    "AUTOCAST",
    "ConfigMemoryOpt",
    "ConfigOpt",
    "DimOpt",
    "EfSearchOpt",
    "MemoryOpt",
    "ModelOpt",
    "NprobeOpt",
    "QuietOpt",
    "SetOpt",
    "TeacherMarginOpt",
    "TeacherRelativeOpt",
]

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML run config.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        metavar="KEY=VALUE",
        help="Override a config key, e.g. train.lr=3e-5 (repeatable).",
    ),
]
ModelOpt = Annotated[
    Path | None,
    typer.Option("--model", help="Model folder (default: output_dir/model); any HF model works."),
]
_MEMORY_HELP = (
    "Peak memory of the whole process, in GB{}; unset, the process may add "
    f"{HEADROOM_GB:g} GB to what it holds when its first search or build begins."
)
MemoryOpt = Annotated[float | None, typer.Option("--memory-gb", help=_MEMORY_HELP.format(""))]
ConfigMemoryOpt = Annotated[  # index's, over its config's key
    float | None,
    typer.Option("--memory-gb", help=_MEMORY_HELP.format(" (default index.memory_gb)")),
]


DimOpt = Annotated[
    int | None,
    typer.Option(
        "--dim",
        help="Vectors cut to their first D dims, re-normalized when the model normalizes "
        "(a Matryoshka model; default index.dim, else the index's own or the full width).",
    ),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
NprobeOpt = Annotated[int, typer.Option(help="IVF lists searched (an IVF index).")]
EfSearchOpt = Annotated[int, typer.Option(help="HNSW search breadth (an HNSW index).")]
AUTOCAST = (
    "auto (bf16 on a GPU from compute capability 8.0, else fp16; fp32 on CPU), fp32, bf16 or fp16"
)
TeacherMarginOpt = Annotated[
    float | None,
    typer.Option(help="Drop a candidate the teacher scores at least positive - MARGIN."),
]
TeacherRelativeOpt = Annotated[
    float | None,
    typer.Option(
        help="Drop a candidate the teacher scores at least positive - (1 - R) x "
        "|positive| (R x a positive above 0; 0.95: NV-Retriever's)."
    ),
]

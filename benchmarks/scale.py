"""The full-scale benchmark: NQ-size data (synthetic, in NQ's structure) through the commands a
user runs, each in a fresh process measured by ``wait4`` (wall time; peak RSS as the kernel
counts it, memory-mapped pages included).

    python -m benchmarks.scale --work runs/scale --out docs/bench   # resumable

Steps run in order; a finished step is skipped on a rerun (its figures live in
``OUT/scale.json``). Big files are deleted once no later step needs them: 32 GB of vectors, a
13 GB TSV and its Arrow cache and GBs of JSON do not fit on this disk together. ``--steps``
runs some steps, ``--redo`` runs finished ones again. ``report`` writes ``OUT/scale.md``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from benchmarks import scale_data, scale_vectors
from benchmarks.machine import cpu_info
from dpr_cache.runtime.atomic import write_json_atomic

STEPS: dict[str, Callable[[Path], dict]] = {
    "vectors": scale_vectors.step_vectors,
    "exact": scale_vectors.step_exact,
    "ivfpq": scale_vectors.step_ivfpq,
    "hnsw": scale_vectors.step_hnsw,
    "tsv": scale_data.step_tsv,
    "eval": scale_data.step_eval,
    "cleanup": scale_data.step_cleanup,
    "json": scale_data.step_json,
    "tokenize": scale_data.step_tokenize,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("runs/scale"))
    parser.add_argument("--out", type=Path, default=Path("docs/bench"))
    parser.add_argument("--steps", nargs="*", default=[*STEPS, "report"])
    parser.add_argument("--redo", nargs="*", default=[])
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    path = args.out / "scale.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    machine = cpu_info()  # steps may run in different sessions, on different machines
    machines = results.setdefault("machines", {})
    for step in STEPS:
        if step in results and step not in machines:
            machines[step] = results.get("machine", machine)
    results["machine"] = machine
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, results)
    for step in args.steps:
        if step == "report":
            from benchmarks.scale_report import write_report

            write_report(results, args.out)
            continue
        if step in results and step not in args.redo:
            print(f"{step}: done, skipped", flush=True)
            continue
        print(f"{step}: running", flush=True)
        results[step] = STEPS[step](args.work)
        machines[step] = machine
        write_json_atomic(path, results)
        print(f"{step}: {json.dumps(results[step])}", flush=True)


if __name__ == "__main__":
    main()

import typer

from benchmarks.gpu.suite import main

typer.run(main)

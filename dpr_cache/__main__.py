"""`python -m dpr_cache` runs the command-line interface."""

from dpr_cache.cli import app

if __name__ == "__main__":
    app()

"""What every layer needs from the machine, each written once: device and precision, the
distributed set-up, memory readings, atomic writes, child processes, quiet libraries and the
seeds of independent random streams.
Nothing here imports the rest of the package (but :mod:`dpr_cache.errors`)."""

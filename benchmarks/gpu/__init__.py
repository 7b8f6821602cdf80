"""The GPU suite (``python -m benchmarks.gpu``): the sections and their run (:mod:`.suite`), the
command line on a device (:mod:`.cli`), exactness (:mod:`.exact`, :mod:`.compiled`), memory and
speed (:mod:`.perf`), decoder LLMs (:mod:`.llm`), FSDP2 (:mod:`.fsdp`) and the page
(:mod:`.report`)."""

"""Hard negatives for a training file: which candidates a rule drops, the one loop that walks a
ranker's candidates, and a run's records read and written around its resumable parts
(:mod:`dpr_cache.runtime.resumable`)."""

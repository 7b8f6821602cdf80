"""Hard negatives for a training file: which candidates a rule drops, the one loop that walks a
ranker's candidates, and the resumable parts of a run."""

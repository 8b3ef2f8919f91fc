"""Many inputs at once on a Ray cluster: `candle-web batch transcribe|embed`.

The same pipelines as the single-file commands (candle_web.pipelines), run by Ray Data: inputs
as a dataset, a read/decode stage, the model in an actor pool, Ray's Parquet writer. Resumable
(a rerun skips what is written) and lossless (a failed input is a row of the errors table).
Ray is the optional `cluster` extra (pip install 'candle-web[cluster]'); this package imports
without it and says so when a batch is run.

    from candle_web.batch import transcribe_many, ClusterOptions
    summary = transcribe_many(["podcasts/"], "out/", formats=["srt"])
"""

from .runner import CLUSTER_EXTRA, ClusterOptions, embed_many, transcribe_many

__all__ = ["CLUSTER_EXTRA", "ClusterOptions", "embed_many", "transcribe_many"]

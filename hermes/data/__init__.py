"""What a run reads and writes: rows, distributions, journal entries, formats, statistics.

    dataset.py        JSONL rows (PromptRow), their content keys, the whole-file check
    task.py           a row's own setup and check in its sandbox (RowTask)
    distributions.py  toolset distributions and their seeded sampling
    entry.py          a journal entry: one finished prompt (JournalEntry, Status, Reward)
    journal.py        the batch files: append, fsync, read
    journal_lines.py  a journal line's trajectory and tail, decoding as little as possible
    run_index.py      the run's DuckDB index over the journal (RunIndex)
    trajectory.py     the ShareGPT trajectory format
    stats.py          tool, reasoning and reward statistics
    failures.py       failure reasons grouped by kind
    outcome.py        the run's verdict on its failed share

Records and formats only: nothing here knows a run folder's layout (that is hermes.run).
"""
from hermes.lazyimport import lazy_surface

__getattr__, __all__ = lazy_surface(__name__, {
    "PromptRow": "dataset",
    "Row": "dataset",
    "Dataset": "dataset",
    "DatasetError": "dataset",
    "read_dataset": "dataset",
    "load_rows": "dataset",
    "content_hash": "dataset",
    "RowTask": "task",
    "DISTRIBUTIONS": "distributions",
    "DistributionError": "distributions",
    "JournalEntry": "entry",
    "HermesBlock": "entry",
    "Reward": "entry",
    "Status": "entry",
    "RunIndex": "run_index",
    "IndexBusy": "run_index",
    "to_sharegpt": "trajectory",
    "TooManyFailedPrompts": "outcome",
    "check_failed_share": "outcome",
})

"""The `capitals` task's documents: capitals.jsonl beside this file (no Hub, no path relative to the shell)."""

import json
from pathlib import Path

import datasets


def load(**kwargs) -> datasets.DatasetDict:
    """lm-eval's `custom_dataset`: {"test": one row per line of capitals.jsonl}; `kwargs` (task metadata) unused."""
    path = Path(__file__).with_name("capitals.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})

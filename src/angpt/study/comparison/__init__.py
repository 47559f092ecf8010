"""The comparison, a kind of study (`angpt compare`): every arm at every token budget and seed of one plan, after a
per-arm learning-rate sweep; its analysis (paired tests, Holm, the speedup, the horizon) and its report. See
docs/compare.md; docs/protocol.md for what it measures and when that counts as evidence."""

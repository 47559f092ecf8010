"""The batch-size study, a kind of study (`angpt scaling batch`): a plan per batch size at a fixed token count, and
each arm's critical batch (McCandlish et al. 2018, arXiv 1812.06162, in its loss-at-fixed-tokens form)."""

"""The scaling ladder, a kind of study (`angpt scaling`): a plan per model size of one dial, the fit of
L(N, D) = E + A / N^alpha + B / D^beta per arm with bootstrap intervals (fit.py: scipy, from the `scaling` extra,
imported lazily), compute-optimal sizes and the LR transfer between sizes. See docs/scaling.md."""

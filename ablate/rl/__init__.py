"""Pure tensor math of the RL step: advantages, policy losses, aggregations, KL, statistics, reward shaping.

Registries of same-signature pure functions, each hand-tested; nothing here touches a model, a file or
the config. Imports nothing from the rest of ablate.
"""

"""Reading programs without running them: a traced program's equations (`jaxpr_walk`), a pallas_call's grid and
BlockSpecs (`grid_walk`), the HBM traffic they cause (`traffic`), whether the grid writes every output element
(`coverage`), whether the program checked is the program timed (`structure`), normalised IR for deduplication
(`ir`), and the top-level ops of a compiled XLA:TPU program (`hlo_ops`)."""

"""Reading programs without running them: a traced program's equations (`jaxpr_walk`), a pallas_call's grid and
BlockSpecs (`grid_walk`), the HBM traffic they cause (`traffic`), whether the grid writes every output element
(`coverage`), whether the program checked is the program timed (`structure`), normalised IR for deduplication
(`ir`), and the top-level ops of a compiled XLA:TPU program (`hlo_ops`).

The function `hlo_ops` is imported from its module (`from tpu_runner.analysis.hlo_ops import hlo_ops`): once the
module is loaded, the package's attribute `hlo_ops` is the module, so the package cannot export the function."""

from tpu_runner import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "OperandTraffic": "traffic", "pallas_traffic": "traffic", "PallasCallTraffic": "traffic",
    "traffic_from_json": "traffic", "traffic_to_json": "traffic", "TrafficReport": "traffic",
    "output_coverage": "coverage",
    "differences": "structure", "program_form": "structure", "ProgramForm": "structure",
    "ir_digest": "ir", "normalise": "ir",
    "HloOp": "hlo_ops", "parsed_hlo": "hlo_ops",
})

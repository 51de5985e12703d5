"""The reference's side of an evaluation: its sandboxed child (`child`: production shapes, exported programs, outputs)
and what is known of it, cached on disk (`store`: `ReferenceStore`)."""

from tpu_runner import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "output_key": "store", "production_configurations": "store", "reference_store": "store",
    "ReferenceStopped": "store", "ReferenceStore": "store",
})

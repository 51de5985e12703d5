"""Ahead-of-time compiles for a TPU target, on any host: lowering and compiling with libtpu and its static profile
(`aot`), the long-lived compile server (`server`) and the service that hands it exported programs (`service`)."""

from tpu_runner import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "target_sharding": "aot",
    "compile_service": "service", "CompileAnswer": "service", "CompileService": "service",
})

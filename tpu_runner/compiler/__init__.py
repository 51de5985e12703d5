"""Ahead-of-time compiles for a TPU target, on any host: lowering and compiling with libtpu and its static profile
(`aot`), the long-lived compile server (`server`) and the service that hands it exported programs (`service`)."""

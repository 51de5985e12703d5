"""The TPU chips: the target table and roofline arithmetic (`targets`), this host's chip and its one holder (`chip`),
the installed libtpu and its flags (`libtpu`), and what differs between the JAX versions kernelbot runs on
(`jax_versions`)."""

from tpu_runner import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "BoundTime": "targets", "chip_for_device_kind": "targets", "CHIPS": "targets", "ChipSpec": "targets",
    "get_chip": "targets", "Roofline": "targets", "roofline": "targets", "sublane_tile": "targets",
    "UnknownTarget": "targets",
    "ChipBusy": "chip", "QUEUED_STAGE": "chip", "runtime_files": "chip", "with_chip_memory": "chip",
    "FAST_FORWARD_FLAG": "libtpu", "knows_flag": "libtpu", "STATIC_PROFILE_FLAG": "libtpu",
    "bind_equation": "jax_versions", "PINNED": "jax_versions", "SUPPORTED": "jax_versions", "supported": "jax_versions",
})

"""The TPU chips: the target table and roofline arithmetic (`targets`), this host's chip and its one holder (`chip`),
the installed libtpu and its flags (`libtpu`), and what differs between the JAX versions kernelbot runs on
(`jax_versions`)."""

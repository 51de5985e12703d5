from subprocess import run

from jax.experimental import pallas as pl


def computation(x):
    run(["true"])
    return pl.pallas_call(lambda x_ref, o_ref: None, out_shape=x)(x)

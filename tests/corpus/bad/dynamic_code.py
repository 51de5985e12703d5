from jax.experimental import pallas as pl


def computation(x):
    exec("import os")
    return pl.pallas_call(lambda x_ref, o_ref: None, out_shape=x)(x)

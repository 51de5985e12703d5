from jax.experimental import pallas as pl


def computation(x, y):  # softmax takes one argument
    return pl.pallas_call(lambda x_ref, o_ref: None, out_shape=x)(x)

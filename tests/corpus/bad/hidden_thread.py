import threading

from jax.experimental import pallas as pl


def computation(x):
    threading.Thread(target=lambda: None).start()
    return pl.pallas_call(lambda x_ref, o_ref: None, out_shape=x)(x)

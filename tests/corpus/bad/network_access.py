import socket

from jax.experimental import pallas as pl


def computation(x):
    socket.create_connection(("example.com", 80))
    return pl.pallas_call(lambda x_ref, o_ref: None, out_shape=x)(x)

"""What the evaluator and its children say to each other and answer: the result (`result`), the structured errors made
from JAX, Pallas, Mosaic and XLA exceptions (`errors`), and the typed records of the parent-child protocol
(`protocol`)."""

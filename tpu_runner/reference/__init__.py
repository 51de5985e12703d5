"""The reference's side of an evaluation: its sandboxed child (`child`: production shapes, exported programs, outputs)
and what is known of it, cached on disk (`store`: `ReferenceStore`)."""

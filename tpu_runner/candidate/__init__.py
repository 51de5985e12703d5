"""The candidate's side of an evaluation: the static check of its source (`static_check`), its sandboxed child
(`child`), that child seen from the parent (`process`), and children and compile servers started ahead of need
(`spares`)."""

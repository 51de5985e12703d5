"""The offline brain: kernels written without a language model, deterministic and without a network, behind the
same interface as the LLM brains (`brain.OfflineBrain`).

How a reference becomes a kernel, in the order the brain walks it:

- reading: `reading` runs the steps that import task code in a sandboxed child; `program` flattens the reference
  into one jaxpr at the production shapes; `positions` evaluates the constants and position-made masks in it.
- recognising: `families` reads the program's structure into a family (row-wise, matmul and its epilogue) and
  hands the others to their own modules: `scan` (prefix sums, linear recurrences), the packages `attention` and
  `conv`; `layout` undoes transposes around a convolution, `tail` keeps the XLA work after the kernel's value.
  `kernel_family` is what a family in its own module provides, so the brain has no case for it.
- choosing: `params` picks block sizes from the roofline and the VMEM budget, with the reasons the plan shows.
- writing: `emit` writes the kernel module, `expr` the reference's ops on VMEM blocks; the kernels' fixed helpers
  are real functions (`kernel_helpers`, each family package's `helpers`) pasted in by `helper_text`.
- mending: `debugger` answers each kind of evaluation error with a fix chosen by that kind.

Task code is never imported in the brain's process: what must run the reference runs in that child, and the brain
works from the data it sends back.
"""

"""Formula sources: plain Python, one function per formula, no device code.

Every public function here is compiled twice by ``steadystep.codegen``: into
``steadystep/cpu/<module>.py`` (Numba ``@njit``) and ``steadystep/cuda/<module>.py``
(Numba ``@cuda.jit``), once per dtype. The functions also run as ordinary Python,
which is how the tests read them.

Conventions the generator relies on:

* The first docstring line is the catalog description; the second paragraph is the
  formula as printed by ``steadystep.catalog()``.
* Numeric literals are written plainly (``1.0 - beta1``); the generator casts each one
  to the kernel's dtype, so a float32 kernel does no float64 arithmetic. A literal
  beyond the dtype's range means the dtype's own limit (``1e308`` is float32's largest
  finite value, ``1e-300`` its smallest normal value).
* Helpers shared by several formulas live in ``_numerics.py``.
"""

ELEMENTWISE_MODULES = ("autograd_graph", "autograd_ops", "gradient_descent")

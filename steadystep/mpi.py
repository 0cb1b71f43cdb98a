"""An alias of steadystep.decentral.mpi (MPIAdamW, one worker per MPI rank), where this module
moved: the same module object under its old name for this release (CHANGELOG.md); it goes in
the next, so import steadystep.decentral.mpi."""

import sys

from steadystep.decentral import mpi as _moved

sys.modules[__name__] = _moved  # the very module: what is set on one is set on the other

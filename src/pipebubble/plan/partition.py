"""The exact min-max partitioner, under its planner name: :mod:`pipebubble.partition`.

The algorithm lives one layer down (``pipebubble/partition.py``: numpy and the error type
only) so that the runtime's default cut (:mod:`pipebubble.runtime.cut`) and the planner use
the same code without the runtime importing the planner. Every name of that module, private
helpers included, is the same object here (``plan.partition.min_max_partition is
partition.min_max_partition``).
"""

from .. import partition as _partition

globals().update({k: v for k, v in vars(_partition).items() if not k.startswith("__")})

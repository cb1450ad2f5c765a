import os

import torch
from hypothesis import settings

# CI has 2 cores: keep torch to one thread per process, and hypothesis quick but thorough.
torch.set_num_threads(1)
settings.register_profile("ci", max_examples=60, deadline=None)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

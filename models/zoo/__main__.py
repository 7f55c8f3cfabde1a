"""python -m models.zoo [NAME ...]: build the zoo's models (all without names) and print where each is."""

import sys

from . import MODELS

for name in sys.argv[1:] or MODELS:
    m = MODELS[name]
    print(f"{name:<26} {m.package}=={m.version} ({m.exporter}): {m.build()}")

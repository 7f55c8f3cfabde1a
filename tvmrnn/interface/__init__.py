"""One module per user verb (compile, run, inspect, ...): resolved arguments as a dataclass, the work as numbered stages.

`tvmrnn.cli` only parses the command line and calls these.
"""

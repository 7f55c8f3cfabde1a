"""Tuning: MetaSchedule (evolutionary search, XGBoost cost model) over our kernels' knob spaces.

tasks     one task per distinct recurrent kernel and batch bucket of a model, as a MetaSchedule workload
search    the pieces MetaSchedule runs for our spaces: design spaces, mutator, builder, feature extractor
logs      tuning logs (MetaSchedule JSON databases) per target: load, merge, validate, best point per shape
progress  the live display of a tuning run
"""

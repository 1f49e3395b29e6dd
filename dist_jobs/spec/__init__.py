"""The spec layer: the job spec's types, loading and validation. Imports only `errors` and msgspec/yaml.

`load_spec` is the way in: it validates everything at once and raises one SpecError.
"""

from dist_jobs.spec.load import load_spec
from dist_jobs.spec.model import JobSpec, json_schema, run_id
from dist_jobs.spec.train import TrainConfig

__all__ = ["JobSpec", "TrainConfig", "json_schema", "load_spec", "run_id"]

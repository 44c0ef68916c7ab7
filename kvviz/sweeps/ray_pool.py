"""A sweep's cases as Ray tasks: one actor per worker loads the model once and runs the cases it is given. Ray is
optional (``pip install ray``); the rows are those of a local run."""

from __future__ import annotations

from collections.abc import Iterator

from kvviz.errors import KvvizError
from kvviz.sweeps.cases import Case, Row, by_prompt, run_cases


class _Runner:
    """A Ray actor's state: the model, loaded once."""

    def __init__(self, model: str | None):
        from kvviz.model import load_model

        self.lm = load_model(model)

    def run(self, cases: list[Case], batch: int) -> list[Row]:
        return run_cases(self.lm, cases, batch)


def ray_rows(model: str | None, todo: list[Case], workers: int, address: str, batch: int = 4) -> Iterator[Row]:
    """The rows of ``todo`` from ``workers`` actors on the Ray cluster at ``address`` (``auto``: the running one;
    ``local``: a new instance on this machine), as they finish."""
    try:
        import ray
    except ImportError:
        raise KvvizError("--ray needs the ray package on this machine and the cluster (pip install ray)") from None
    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address, num_cpus=workers if address == "local" else None,
                 include_dashboard=False, log_to_driver=False)
    runner = ray.remote(num_cpus=1)(_Runner)
    actors = [runner.remote(model) for _ in range(max(1, workers))]
    groups = by_prompt(todo)  # one task per prompt: its cases share the full-cache run
    pending = [actors[index % len(actors)].run.remote(group, batch) for index, group in enumerate(groups)]
    while pending:
        finished, pending = ray.wait(pending, num_returns=1)
        yield from ray.get(finished[0])

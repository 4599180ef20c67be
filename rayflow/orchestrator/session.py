"""The jobs of one invocation: start each cluster once, run the jobs that share it, stop it.

`run_jobs` is what the CLI (one job, or every point of a `-m` sweep) and `rayflow.run` call, with
the plans the preflight made (rayflow.orchestrator.preflight): a cluster's lifetime is one `with`
block (rayflow.orchestrator.cluster) spanning the consecutive jobs whose backend config is the same.
Each job is a dry run (the spec and its notes, nothing started), a run submitted to its cluster as a
Ray Job (vm, kuberay: rayflow.orchestrator.remote_run), or a run in this process, in the experiment
folder it holds while it runs (rayflow.orchestrator.driver).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence

import yaml

from rayflow.orchestrator.cluster import SharedCluster, cluster_key, cluster_scope
from rayflow.orchestrator.driver import run_here
from rayflow.orchestrator.preflight import Plan, local_files_ok, storage_refusal
from rayflow.orchestrator.remote_run import run_submitted
from rayflow.results.experiment import claimed_experiment
from rayflow.results.run_result import RunResult
from rayflow.runtime.run_log import quiet_libraries
from rayflow.runtime.signals import reset_termination
from rayflow.runtime.verbosity import level
from rayflow.security.redaction import literal_secrets_note
from rayflow.tracking.tracker import Tracker, is_local_store


def run_jobs(plans: Sequence[Plan]) -> list[RunResult | None]:
    """Run checked jobs in order, each cluster started once for the consecutive jobs that share it
    and stopped when they are done, or when one of them fails or is interrupted: then the exception
    goes on after the teardown, and the rest do not run."""
    results: list[RunResult | None] = []
    for group in _consecutive(plans):
        first = group[0]
        with cluster_scope(
            first.backend, first.preload, dry_run=bool(first.cfg.dry_run)
        ) as cluster:
            for plan in group:
                results.append(run_job(plan, cluster))
    return results


def run_job(plan: Plan, cluster: SharedCluster) -> RunResult | None:
    """One job on `cluster` (started by the first job that acquires it): its RunResult (None for a
    dry run; a run submitted as a Ray Job returns what the job sent back). Raises RunFailed,
    RunInterrupted or Terminated after its own clean-up; the cluster is stopped by the `with` block
    that holds it."""
    reset_termination()  # a signal an earlier job of this process received is not this job's
    if plan.cfg.dry_run:
        dry_run(plan, cluster.spec)
        return None
    if plan.backend.traits.submits_jobs:  # the job keeps the run's log (its own run_here)
        with quiet_libraries(level(plan.cfg.get("verbose")), Tracker(plan.cfg).libraries):
            return run_submitted(plan, cluster)
    found = plan.resumed.experiment if plan.resumed else None  # as the preflight located it
    with claimed_experiment(plan.cfg, found) as experiment:  # made (new) and held while it runs
        return run_here(plan, cluster, experiment)


def dry_run(plan: Plan, spec: str) -> None:
    """The spec on stdout, exactly what the engine takes; what is left to the user on stderr."""
    sys.stdout.write(spec)
    rendered = plan.backend.render(plan.preload)
    notes = list(rendered.notes)
    if not rendered.secrets_noted:
        notes += literal_secrets_note(yaml.safe_load(rendered.text))
    if (
        plan.cfg.tracking.enabled
        and not local_files_ok(plan.backend)
        and is_local_store(plan.cfg.tracking.uri)
    ):
        notes.append(
            "tracking.uri: a real run needs a tracking server (http(s)://, databricks): "
            "the cluster's nodes do not share this machine's files"
        )
    refusal = storage_refusal(plan.cfg, plan.backend, plan.on_head)
    if refusal:  # first: the backend's own summary stays the last line
        notes.insert(0, f"storage_path: a real run refuses it: {refusal}")
    for note in notes:
        print(note if note.startswith("rayflow:") else f"rayflow: {note}", file=sys.stderr)


def _consecutive(plans: Sequence[Plan]) -> Iterator[list[Plan]]:
    """The jobs in runs of consecutive ones that share a cluster (the same backend config)."""
    group: list[Plan] = []
    for plan in plans:
        if group and cluster_key(plan.cfg) != cluster_key(group[0].cfg):
            yield group
            group = []
        group.append(plan)
    if group:
        yield group

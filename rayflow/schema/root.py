"""The root config's own keys and the groups every job has: compute and tracking; `Section`, the
base of every model of a config section (the backends' and workloads' beside their code)."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rayflow.schema.kinds import (
    NAME_MAX,
    Boolean,
    FolderName,
    Integer,
    Number,
    OneOf,
    OptionalText,
    Seconds,
    StorageDir,
    Text,
    kind,
    path_length_error,
)


def _resume(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip():
        error = path_length_error(value)
        if error:
            raise ValueError(f"an experiment path {error}")
        return value
    raise ValueError(f"must be true, false or an experiment path; got {value!r}")


VERBOSE_MAX = 3
SIGNERS_MAX = 100  # keys a team may list in trusted_signers


def _signers(value: Any) -> list[str]:
    from rayflow.security.keys import KEY_PREFIX, valid_public_id

    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"must be a list of public keys ({KEY_PREFIX}...); got {value!r}")
    if len(value) > SIGNERS_MAX:
        raise ValueError(f"lists {len(value)} keys; at most {SIGNERS_MAX}")
    for item in value:
        if not isinstance(item, str) or len(item) > 100 or not valid_public_id(item):
            shown = repr(item)[:60]
            raise ValueError(
                f"{shown} is not a rayflow public key (`rayflow key` prints one: {KEY_PREFIX} "
                "and 43 characters)"
            )
    return value


def _verbose(value: Any) -> int | bool:
    if isinstance(value, bool) or (isinstance(value, int) and 0 <= value <= VERBOSE_MAX):
        return value
    raise ValueError(f"must be an integer from 0 to {VERBOSE_MAX}, true or false; got {value!r}")


def _nonblank_uri(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must not be empty (use tracking=none to turn tracking off)")
    return value


SEED_MAX = 2**32 - 1  # numpy's seeds
# An experiment folder that exists already gets a suffix (`-1`, `-2`, ...:
# rayflow.workloads.tune_runner), which must still fit one folder name.
EXPERIMENT_NAME_MAX = NAME_MAX - 15

ResumeKind = kind("true, false or an experiment folder", _resume)
RayAuthModeKind = OneOf("token", "disabled")
DeviceKind = OneOf("cpu", "cuda", "auto")
UriKind = kind("an MLflow tracking URI", _nonblank_uri)
VerboseKind = kind(f"0 to {VERBOSE_MAX}, true or false", _verbose)
SignersKind = kind("a list of rayflow public keys", _signers)


class Section(BaseModel):
    # Hydra refuses unknown keys while composing (struct mode); what gets past it on purpose
    # (`+backend.some_secret=...`, a new spark_conf entry) is the user's to add.
    model_config = ConfigDict(extra="allow", validate_default=True)


class Part(Section):
    """A mapping inside a section (backend.worker.cpu, backend.head): a value that is not a
    mapping is refused in words (pydantic's own message names its class), and `check_keys`
    may refuse keys it does not know before any of its keys is read."""

    @model_validator(mode="before")
    @classmethod
    def _a_mapping(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(f"must be a mapping, got {value!r}")
        cls.check_keys(value)
        return value

    @classmethod
    def check_keys(cls, value: dict[str, Any]) -> None:
        """Raise KeyedError for a key this part does not take (default: any is let through)."""


class Root(Section):
    dry_run: Boolean = Field(description="validate, print the cluster spec as YAML, start nothing")
    resume: ResumeKind = Field(
        description="`true`: continue the latest experiment of this workload; a path: that "
        "experiment. Refused when the tracking store does not hold the experiment's parent run "
        "(run from the folder of the first run, give its `tracking.uri`, or `tracking=none`)"
    )
    storage_path: StorageDir = Field(
        description="where every experiment keeps Tune's and Train's state, every checkpoint "
        "and the files the results are read from: an object store (`s3://BUCKET/PATH`, "
        "`gs://BUCKET/PATH`; S3-compatible stores through `AWS_ENDPOINT_URL`), checked before "
        "anything starts, or a folder. A folder is refused where the cluster's nodes are separate "
        "machines, unless every node mounts it (`storage_shared`); on a cluster sharing this "
        "machine's files it must be creatable and writable here"
    )
    storage_shared: Boolean = Field(
        description="`true`: the folder `storage_path` names is mounted at that path on every "
        "node (NFS, a shared disk), so a cluster of separate machines may use it. Databricks "
        "`/dbfs/` and `/Volumes/` paths are known to be shared without it"
    )
    experiment_name: FolderName(EXPERIMENT_NAME_MAX) = Field(
        description="the experiment folder under `storage_path` (default "
        "`<workload>-<date>-<time>`); one that exists already, or is being made by another run, "
        "gets a suffix `-1`, `-2`, ..."
    )
    seed: Integer(0, SEED_MAX) = Field(description="data split and synthetic data (numpy's seeds)")
    schedule_timeout_s: Seconds() = Field(
        description="how long a trial, Train worker or env runner that no node of the running "
        "cluster can hold may stay pending, while the cluster does not grow, before "
        "the run fails"
    )
    verbose: VerboseKind = Field(
        description="what a run prints besides rayflow's own lines and the results: `0` (`false`, "
        "the default) nothing more, the autoscaler's lines summarised as one line per scale event; "
        "`1` the autoscaler's own lines; `2` (`true`) also Ray Tune's trial status tables and "
        "start/end boxes; `3` also Tune's box of every reported result"
    )
    trusted_signers: SignersKind = Field(
        description="the public keys (`rayflow key` prints this user's) of the other people whose "
        "experiments a resume believes, for a team sharing a bucket on purpose; this user's own "
        "key is always trusted. A resume refuses an experiment that no trusted key signed, or "
        "that changed since it was signed"
    )
    ray_auth_mode: RayAuthModeKind = Field(
        description="Ray token auth for every cluster rayflow starts or joins, "
        "exported as `RAY_AUTH_MODE` (default `$RAY_AUTH_MODE`, else `token`)"
    )


class Compute(Section):
    device: DeviceKind = Field(description="the device trials use (`compute=cpu|gpu|auto`)")
    gpus_per_trial: Number(allow_zero=True, optional=True) = Field(
        description="GPUs per trial or worker; null with "
        "`compute=auto`: decided once the cluster is up"
    )


class Mlflow(Section):
    enabled: Boolean = Field(description="log to MLflow (`tracking=none` turns it off)")
    uri: UriKind = Field(
        description="the MLflow store, relative to where you run (default `$MLFLOW_TRACKING_URI`, "
        "else `sqlite:///mlflow.db`)"
    )
    experiment: Text = Field(description="the MLflow experiment (default: the workload's name)")
    log_best_checkpoint: Boolean = Field(
        description="copy the best trial's checkpoint into the parent run"
    )
    timeout_s: Seconds() = Field(
        description="how long the tracking server (`http(s)://`) or database may take to answer "
        "the preflight check"
    )


class NoTracking(Section):
    enabled: Boolean = Field(description="false: nothing is logged to MLflow")


__all__ = [
    "Compute",
    "DeviceKind",
    "Mlflow",
    "NoTracking",
    "OptionalText",
    "Part",
    "Root",
    "Section",
]

"""Bad input, as users type it by mistake: each is refused before anything starts.

One table across every config group, its rows run three at a time. For each row
`python -m rayflow` (forked from a process that has imported it; a sample of rows also in a new
interpreter, which must print the same) must exit 2 within 60 s with one line `rayflow: error: <key>: ...` naming
the key, print no traceback, and leave no Ray or Spark process, experiment folder, MLflow
store or Hydra output behind.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rayflow.testing.processes import ray_daemon_pids
from tests.harness.cli import Rayflow
from tests.harness.forked import run_forked

TUNE = ["workload.metric=loss", "workload.mode=min"]  # what every workload=tune command names
# bad Ray cluster YAMLs (backend.cluster_yaml)
VM_FILES = Path(__file__).parent / "bad_cluster_yaml"

BAD_INPUT = [
    # booleans take true/false only (a string like "maybe" is truthy)
    (["dry_run=maybe"], "dry_run"),
    (["data.synthetic=maybe"], "data.synthetic"),
    (["data.download=perhaps"], "data.download"),
    (["backend.include_dashboard=maybe"], "backend.include_dashboard"),
    (["workload.reuse_actors=maybe"], "workload.reuse_actors"),
    (["tracking.log_best_checkpoint=1"], "tracking.log_best_checkpoint"),
    (["workload=ddp", "workload.amp=maybe"], "workload.amp"),
    (["workload=ddp", "workload.tune=yes"], "workload.tune"),
    (["workload=ppo", "workload.vf_share_layers=maybe"], "workload.vf_share_layers"),
    (["backend=spark", "backend.hybrid=sometimes"], "backend.hybrid"),
    (["backend=spark", "backend.strict_mode=null"], "backend.strict_mode"),
    # the tracking store, before the cluster
    (["tracking.uri=bogus://x"], "tracking.uri"),
    (["tracking.uri=http://127.0.0.1:1"], "tracking.uri"),
    (["tracking.uri=http://user:pw@127.0.0.1:1"], "tracking.uri"),
    (["tracking.uri=sqlite:////proc/no-such-dir/mlflow.db"], "tracking.uri"),
    (["tracking.uri=postgresql://127.0.0.1:1/mlflow"], "tracking.uri"),
    (["tracking.uri= "], "tracking.uri"),
    (["tracking.timeout_s=0"], "tracking.timeout_s"),
    # demands the cluster could never place
    (["workload.resources_per_trial.cpu=1000"], "workload.resources_per_trial.cpu"),
    (
        ["backend.num_cpus=1", "workload.resources_per_trial.cpu=2"],
        "workload.resources_per_trial.cpu",
    ),
    (
        ["workload.resources_per_trial.memory=1000000000000000"],
        "workload.resources_per_trial.memory",
    ),
    (["workload=ddp", "workload.num_workers=64"], "workload.num_workers"),
    (
        ["workload=ddp", "workload.resources_per_worker.cpu=100"],
        "workload.resources_per_worker.cpu",
    ),
    (["workload=ppo", "workload.num_env_runners=64"], "workload.num_env_runners"),
    (["backend=spark", "backend.num_cpus_worker_node=4"], "backend.num_cpus_worker_node"),
    (["backend=spark", "workload.resources_per_trial.cpu=2"], "workload.resources_per_trial.cpu"),
    (["workload.resources_per_trial.gpu=1"], "workload.resources_per_trial.gpu"),
    (["schedule_timeout_s=0"], "schedule_timeout_s"),
    # the classes of issue 2: unknown keys and options, bad numbers, bounds, sweeps, resume
    (["workload.nosuch=1"], "workload.nosuch"),
    (["backend=nosuch"], "backend=nosuch"),
    (["workload=nosuch"], "workload=nosuch"),
    (["compute=nosuch"], "compute=nosuch"),
    (["workload.num_samples=0"], "workload.num_samples"),
    (["workload.num_samples=abc"], "workload.num_samples"),
    (["workload.max_epochs=-2"], "workload.max_epochs"),
    (
        ["workload.search_space.lr.min=0.5", "workload.search_space.lr.max=0.01"],
        "workload.search_space.lr",
    ),
    (["workload.search_space.batch_size=[]"], "workload.search_space.batch_size"),
    (["workload.scheduler.grace_period=50"], "workload.scheduler.grace_period"),
    (["workload.metric=accuracy"], "workload.metric"),
    (["data.val_fraction=1.5"], "data.val_fraction"),
    (["data.timeout_s=-1"], "data.timeout_s"),
    (["ray_auth_mode=maybe"], "ray_auth_mode"),
    (["backend.num_cpus=0"], "backend.num_cpus"),
    (["compute=gpu"], "compute"),
    (["backend=attach", "backend.address=127.0.0.1:1"], "backend.address"),
    (["backend=attach", "backend.address=nonsense"], "backend.address"),
    (["-m", "workload.num_samples=2,0"], "workload.num_samples"),
    (["workload.num_samples=2,4"], "workload.num_samples"),
    (["resume=true"], "resume"),
    (
        ["resume=/nowhere/cifar-1"],
        "resume",
    ),  # a path is taken (resume=PATH) and checked as a folder
    (["workload=ddp", "workload.warmup_epochs=20"], "workload.warmup_epochs"),
    (["workload=ppo", "workload.env=NoSuchEnv-v0"], "workload.env"),
    (["backend=spark", "backend.min_worker_nodes=3"], "backend.min_worker_nodes"),
    (["backend=spark", "+backend.num_worker_nodes=2"], "backend.num_worker_nodes"),
    (["backend=spark", "backend.master=yarn"], "backend.master"),
    (["backend=spark", "backend.master='local[2]'"], "backend.num_cpus_worker_node"),
    # backend=vm: outdated guides, sizes, SSH, where tracking can go
    (["backend=vm", "+backend.initial_workers=2"], "backend.initial_workers"),
    (
        ["backend=vm", "+backend.target_utilization_fraction=0.8"],
        "backend.target_utilization_fraction",
    ),
    (
        ["backend=vm", "backend.provider=aws", "+backend.instance_type=m5.large"],
        "backend.instance_type",
    ),
    (["backend=vm", "backend.min_worker_nodes=3"], "backend.min_worker_nodes"),
    (["backend=vm", "compute=gpu", "backend.worker.gpu.num_gpus=0"], "backend.worker.gpu.num_gpus"),
    (
        ["backend=vm", "backend.provider=local", "backend.ssh_private_key=/nonexistent/key"],
        "backend.ssh_private_key",
    ),
    (["backend=vm", "backend.provider=aws", "tracking.uri=sqlite:///mlflow.db"], "tracking.uri"),
    (["backend=vm", "backend.provider=nosuch"], "backend.provider"),
    (["backend=vm", "backend.keep_cluster=maybe"], "backend.keep_cluster"),
    (["backend=vm", "backend.worker.cpu.num_cpus=1.5"], "backend.worker.cpu.num_cpus"),
    # backend=vm backend.cluster_yaml: the user's own Ray cluster YAML (tests/bad_cluster_yaml/)
    (["backend=vm", "backend.cluster_yaml=/nonexistent/cluster.yaml"], "backend.cluster_yaml"),
    (["backend=vm", f"backend.cluster_yaml={VM_FILES / 'not-yaml.yaml'}"], "backend.cluster_yaml"),
    (
        ["backend=vm", f"backend.cluster_yaml={VM_FILES / 'max-workers-lots.yaml'}"],
        "backend.cluster_yaml",
    ),
    (
        ["backend=vm", f"backend.cluster_yaml={VM_FILES / 'legacy-head-node.yaml'}"],
        "backend.cluster_yaml",
    ),
    (
        ["backend=vm", f"backend.cluster_yaml={VM_FILES / 'local-placeholders.yaml'}"],
        "backend.cluster_yaml",
    ),
    (
        ["backend=vm", f"backend.cluster_yaml={VM_FILES / 'gcp-project-placeholder.yaml'}"],
        "backend.cluster_yaml",
    ),
    (
        [
            "backend=vm",
            f"backend.cluster_yaml={VM_FILES / 'max-workers-lots.yaml'}",
            "backend.head_ip=10.0.0.1",
        ],
        "backend.head_ip",
    ),
    # backend=kuberay: names, replicas, quantities, the autoscaler, RayJob lifecycle, and
    # KubeRay's CRD schema and operator rules on what backend.overrides adds
    (
        ["backend=kuberay", "+backend.overrides.spec.enableInTreeAutoscalling=true"],
        "backend.overrides",
    ),
    (
        [
            "backend=kuberay",
            "backend.autoscaler_version=v2",
            "+backend.overrides.spec.headGroupSpec.template.spec.restartPolicy=Always",
        ],
        "backend.overrides",
    ),
    (["backend=kuberay", "backend.cluster_name=Bad_Name"], "backend.cluster_name"),
    (["backend=kuberay", "backend.cluster_name=" + "r" * 60], "backend.cluster_name"),
    (
        ["backend=kuberay", "backend.mode=rayjob", "backend.cluster_name=" + "r" * 50],
        "backend.cluster_name",
    ),
    (
        [
            "backend=kuberay",
            "backend.worker_groups.cpu.min_replicas=3",
            "backend.worker_groups.cpu.max_replicas=2",
        ],
        "backend.worker_groups.cpu.min_replicas",
    ),
    (
        ["backend=kuberay", "backend.worker_groups.cpu.memory='5 Gi'"],
        "backend.worker_groups.cpu.memory",
    ),
    (["backend=kuberay", "backend.autoscaler_version=v3"], "backend.autoscaler_version"),
    (["backend=kuberay", "backend.upscaling_mode=Fast"], "backend.upscaling_mode"),
    (
        [
            "backend=kuberay",
            "backend.mode=rayjob",
            "backend.rayjob.shutdown_after_job_finishes=false",
        ],
        "backend.rayjob.ttl_seconds_after_finished",
    ),
    (
        ["backend=kuberay", "ray_auth_mode=token", "backend.ray_version=2.40.0"],
        "backend.ray_version",
    ),
    (["backend=kuberay", "backend.mode=serverless"], "backend.mode"),
    (["backend=kuberay", "backend.min_worker_nodes=3"], "backend.min_worker_nodes"),
    (["backend=kuberay", "backend.start_timeout_s=0"], "backend.start_timeout_s"),
    # backend=kuberay backend.manifest: the user's own RayCluster/RayJob file (tests/bad_kuberay_manifest/)
    (["backend=kuberay", "backend.manifest=/nonexistent/raycluster.yaml"], "backend.manifest"),
    (
        [
            "backend=kuberay",
            f"backend.manifest={Path(__file__).parent / 'bad_kuberay_manifest' / 'not-yaml.yaml'}",
        ],
        "backend.manifest",
    ),
    (
        [
            "backend=kuberay",
            f"backend.manifest={Path(__file__).parent / 'bad_kuberay_manifest' / 'no-ray-document.yaml'}",
        ],
        "backend.manifest",
    ),
    (
        [
            "backend=kuberay",
            f"backend.manifest={Path(__file__).parent / 'bad_kuberay_manifest' / 'two-ray-documents.yaml'}",
        ],
        "backend.manifest",
    ),
    (
        [
            "backend=kuberay",
            f"backend.manifest={Path(__file__).parent / 'bad_kuberay_manifest' / 'crd-violation.yaml'}",
        ],
        "backend.manifest",
    ),
    (
        [
            "backend=kuberay",
            f"backend.manifest={Path(__file__).parent / 'bad_kuberay_manifest' / 'placeholder.yaml'}",
        ],
        "backend.manifest",
    ),
    (
        [
            "backend=kuberay",
            "compute=gpu",
            f"backend.manifest={Path(__file__).parent / 'bad_kuberay_manifest' / 'cpu-only.yaml'}",
        ],
        "backend.manifest",
    ),
    # the user's own code: names that do not import or are not functions, the vocabulary of the
    # search space, schedulers and search algorithms, what Tune optimises, RLlib's names
    (["workload=tune", "workload.trainable=no_such_module:objective", *TUNE], "workload.trainable"),
    (["workload=tune", "workload.trainable=math:pi", *TUNE], "workload.trainable"),
    (["workload=tune", "workload.trainable=json:no_such_function", *TUNE], "workload.trainable"),
    (["workload=tune", "workload.trainable=objective", *TUNE], "workload.trainable"),
    (["workload=tune", "workload.trainable=math:sqrt", "workload.mode=min"], "workload.metric"),
    (["workload=tune", "workload.trainable=math:sqrt", "workload.metric=loss"], "workload.mode"),
    (
        [
            "workload=tune",
            "workload.trainable=math:sqrt",
            *TUNE,
            "workload.search_space={lr: {logunifrom: [1e-4, 1e-1]}}",
        ],
        "workload.search_space.lr",
    ),
    (
        [
            "workload=tune",
            "workload.trainable=math:sqrt",
            *TUNE,
            "workload.search_space={lr: {loguniform: [0.1, 1e-4]}}",
        ],
        "workload.search_space.lr",
    ),
    (
        [
            "workload=tune",
            "workload.trainable=math:sqrt",
            *TUNE,
            "workload.search_space={model: {width: {choice: []}}}",
        ],
        "workload.search_space.model.width",
    ),
    (
        ["workload=tune", "workload.trainable=math:sqrt", *TUNE, "workload.scheduler=ashaa"],
        "workload.scheduler",
    ),
    (
        [
            "workload=tune",
            "workload.trainable=math:sqrt",
            *TUNE,
            "workload.scheduler={name: asha, grace_periodd: 2}",
        ],
        "workload.scheduler.grace_periodd",
    ),
    (
        ["workload=tune", "workload.trainable=math:sqrt", *TUNE, "workload.search_alg=nosuch"],
        "workload.search_alg",
    ),
    (
        [
            "workload=tune",
            "workload.trainable=math:sqrt",
            *TUNE,
            "workload.scheduler={name: pbt, hyperparam_mutations: {lr: [0.1, 0.01]}}",
            "workload.checkpoint.num_to_keep=2",
        ],
        "workload.checkpoint.num_to_keep",
    ),
    (["workload=train", "workload.train_loop=no_such_module:train_loop"], "workload.train_loop"),
    (
        [
            "workload=train",
            "workload.train_loop=math:sqrt",
            "workload.sweep={metric: loss, mode: min, search_space: {lr: {uniform: [1]}}}",
        ],
        "workload.sweep.search_space.lr",
    ),
    (["workload=rllib", "workload.algorithm=NoSuchAlgorithm"], "workload.algorithm"),
    (
        ["workload=rllib", "workload.algorithm=DQN", "workload.grid={no_such_key: [1, 2]}"],
        "workload.grid.no_such_key",
    ),
    (["workload=rllib", "workload.config={trainingg: {lr: 0.1}}"], "workload.config.trainingg"),
    (
        ["workload=rllib", "workload.config={training: {no_such_setting: 0.1}}"],
        "workload.config.training",
    ),
    (["workload=rllib", "workload.env=NoSuchEnv-v0"], "workload.env"),
    # kinds: a seed numpy takes, directories that can be made and written here, one folder's name
    (["seed=-1"], "seed"),
    (["storage_path=/proc/x"], "storage_path"),
    (["data.root=/proc/x"], "data.root"),
    (["experiment_name=../../escape"], "experiment_name"),
    # issue 30: every value bounded (tests/test_security_state.py walks the schema for it): a
    # timeout that overflows C's, a name longer than a folder's, a size that allocates until the
    # machine dies, a port beyond 65535, a typo added to a preset with `+`
    (["tracking.timeout_s=1e300"], "tracking.timeout_s"),
    (["backend=attach", "backend.connect_timeout_s=1e300"], "backend.connect_timeout_s"),
    (["experiment_name=" + "e" * 300], "experiment_name"),
    (["storage_path=/tmp/" + "s" * 300], "storage_path"),
    # issue 33: object stores rayflow writes to, in their form (reaching one: tests/test_storage.py);
    # a folder of one machine where the nodes are separate machines
    (["storage_path=ftp://bucket/runs"], "storage_path"),
    (["storage_path=s3://"], "storage_path"),
    (["data.root=s3://bucket/data"], "data.root"),
    (["backend=kuberay", "tracking=none"], "storage_path"),
    (["backend=vm", "backend.provider=aws", "tracking=none"], "storage_path"),
    (["data.synthetic_train_size=1000000000000"], "data.synthetic_train_size"),
    (["backend.dashboard_port=70000"], "backend.dashboard_port"),
    (["+workload.num_sample=5"], "workload.num_sample"),
    # issue 30, 43: one rule for auth off, by exposure: every Ray cluster listens beyond loopback,
    # so it is refused on every backend and from every source (keys, overrides), naming
    # ray_auth_mode first; cluster names validated before they name a file
    (["backend.dashboard_host=0.0.0.0", "ray_auth_mode=disabled"], "ray_auth_mode"),
    (["backend.dashboard_host=127.0.0.1", "ray_auth_mode=disabled"], "ray_auth_mode"),
    (["backend=vm", "ray_auth_mode=disabled"], "ray_auth_mode"),
    (["backend=spark", "ray_auth_mode=disabled"], "ray_auth_mode"),
    (["backend=kuberay", "ray_auth_mode=disabled"], "ray_auth_mode"),
    (
        ["backend=kuberay", "ray_auth_mode=disabled", "backend.service_type=LoadBalancer"],
        "ray_auth_mode",
    ),
    (
        ["backend=kuberay", "ray_auth_mode=disabled", "backend.service_type=NodePort"],
        "ray_auth_mode",
    ),
    (
        [
            "backend=kuberay",
            "ray_auth_mode=disabled",
            "+backend.overrides.spec.headGroupSpec.enableIngress=true",
        ],
        "ray_auth_mode",
    ),
    (["backend=kuberay", "+backend.overrides.spec.authOptions.mode=disabled"], "ray_auth_mode"),
    (
        [
            "backend=kuberay",
            "+backend.overrides.spec.authOptions.enableK8sTokenAuth=true",
            "backend.ray_version=2.53.0",
        ],
        "backend.overrides",
    ),
    (
        ["backend=attach", "backend.address=127.0.0.1:6379", "ray_auth_mode=disabled"],
        "ray_auth_mode",
    ),
    (["backend=vm", "backend.provider=aws", "ray_auth_mode=disabled"], "ray_auth_mode"),
    (
        [
            "backend=vm",
            "backend.provider=aws",
            "ray_auth_mode=disabled",
            "+backend.overrides={head_start_ray_commands: ['ray start --head --dashboard-host=0.0.0.0']}",
        ],
        "ray_auth_mode",
    ),
    (
        [
            "backend=vm",
            "backend.provider=aws",
            "+backend.overrides={head_start_ray_commands: ['ray start --head']}",
        ],
        "ray_auth_mode",
    ),
    (["backend=vm", "+backend.overrides={cluster_name: ../../x}"], "backend.overrides"),
]


# Rows also run as a fresh `python -m rayflow` (the others run forked: tests/harness/forked.py):
# the first row of each kind of check named here (a type, the tracking store's probe, a demand
# the cluster cannot place, an unknown key, a search space, resume, a user's cluster file).
FRESH = [
    next(i for i, (_, key) in enumerate(BAD_INPUT) if key == name)
    for name in (
        "dry_run",
        "tracking.uri",
        "workload.resources_per_trial.cpu",
        "workload.nosuch",
        "workload.search_space.lr",
        "resume",
        "backend.cluster_yaml",
    )
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory, data_root):
    """Every row's `python -m rayflow`, each in a work folder of its own, three at a time (none
    starts anything): {row index: (runner, output, seconds)}. Each row runs in a process forked
    from one that has imported rayflow (the interpreter's start-up, most of a refusal's time,
    paid once); the FRESH rows run as a new interpreter too, which must print the same."""
    from concurrent.futures import ThreadPoolExecutor

    def refuse(index: int):
        args, _ = BAD_INPUT[index]
        runner = Rayflow(tmp_path_factory.mktemp(f"bad-input-{index}"), data_root)
        streams = tmp_path_factory.mktemp(f"bad-input-{index}-streams")
        started = time.monotonic()
        out = run_forked(runner.argv(*args), runner.workdir, runner.env, streams, timeout=60)
        return index, (runner, out, time.monotonic() - started)

    def fresh(index: int):
        args, _ = BAD_INPUT[index]
        runner = Rayflow(tmp_path_factory.mktemp(f"bad-input-fresh-{index}"), data_root)
        return index, (runner, runner.run(*args, timeout=60))

    before = ray_daemon_pids()
    with ThreadPoolExecutor(max_workers=3) as pool:
        seen = dict(pool.map(refuse, range(len(BAD_INPUT))))
        new = dict(pool.map(fresh, FRESH))
    yield seen, new, before


def test_a_new_interpreter_refuses_as_the_forked_one_does(refusals):
    seen, new, _ = refusals

    def shown(runner, out):  # each ran in a work folder of its own
        texts = (out.stdout, out.stderr)
        return out.returncode, [text.replace(str(runner.workdir), "WORKDIR") for text in texts]

    for index, (runner, out) in new.items():
        assert shown(runner, out) == shown(*seen[index][:2]), BAD_INPUT[index]


@pytest.mark.parametrize("index", range(len(BAD_INPUT)), ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_naming_the_key(refusals, index):
    args, key = BAD_INPUT[index]
    if args == ["compute=gpu"]:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    seen, _, before = refusals
    rayflow, out, seconds = seen[index]
    assert seconds < 60
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"rayflow: error: {key}"), lines[0]
    assert "Traceback" not in out.stdout + out.stderr
    assert ray_daemon_pids() == before
    assert not rayflow.storage.exists() and not rayflow.db.exists()
    assert (
        not (rayflow.workdir / "outputs").exists() and not (rayflow.workdir / "multirun").exists()
    )
    assert "pw@" not in out.stderr  # credentials in a URI are masked in the error too


def test_the_table_covers_every_config_group():
    covered = " ".join(" ".join(args) for args, _ in BAD_INPUT)
    assert len(BAD_INPUT) >= 40
    for group in (
        "backend=spark",
        "backend=attach",
        "backend=vm",
        "backend=kuberay",
        "workload=ddp",
        "workload=ppo",
        "workload=tune",
        "workload=train",
        "workload=rllib",
        "tracking.",
        "compute=",
        "data.",
    ):
        assert group in covered, group

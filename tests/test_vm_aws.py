"""backend=vm provider=aws against an EC2 API: moto's server, in a network namespace that has only
its loopback interface (tests/harness/ec2_server.py), through the standard AWS_ENDPOINT_URL and
keys it checks. Ray's real AWS node provider and bootstrap talk to it (IAM role and instance
profile, key pair, security group, instances); nothing inside Ray or rayflow is patched. Every
rayflow process runs inside the namespace: Ray's launcher waiting for SSH on a head whose address
moto made up fails there at once, and no packet leaves this machine.

What only a real account shows (SSH into the VMs, setup commands, a reclaimed spot VM) is listed
in docs/backends/vm.md."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from rayflow.testing.processes import wait_until
from tests.harness.ec2_server import REGION, Ec2Namespace

# A user's multi-node-type file as Ray's example-multi-node-type.yaml writes one: no `resources`
# (`ray up` fills them from EC2), a spot CPU type, a GPU type.
MULTI = {
    "cluster_name": "CLUSTER",
    "max_workers": 4,
    "provider": {"type": "aws", "region": REGION},
    "available_node_types": {
        "head": {"node_config": {"InstanceType": "m5.large"}},
        "cpu_spot": {
            "min_workers": 0,
            "max_workers": 2,
            "node_config": {
                "InstanceType": "m5.large",
                "InstanceMarketOptions": {"MarketType": "spot"},
            },
        },
        "gpu": {"min_workers": 0, "max_workers": 2, "node_config": {"InstanceType": "g4dn.xlarge"}},
    },
    "head_node_type": "head",
}


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ec2():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("a network namespace needs root and `ip` (iproute2)")
    with Ec2Namespace() as namespace:
        yield namespace
    assert not os.path.exists(f"/run/netns/{namespace.name}"), "the namespace was left"


class User:
    """A user of this machine inside the namespace: their own home (Ray's key pair lands in
    ~/.ssh, the token in ~/.ray), their folder, the EC2 settings in their environment."""

    def __init__(self, ec2: Ec2Namespace, folder: Path):
        self.ec2, self.folder = ec2, folder
        home = folder / "home"
        home.mkdir(parents=True)
        self.env = {
            **os.environ,
            **ec2.env(),
            "HOME": str(home),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("MLFLOW_TRACKING_URI", None)

    def argv(self, *args: str) -> list[str]:
        base = ["tracking=none", "storage_shared=true"]  # nothing of these tests' concern
        return self.ec2.argv(sys.executable, "-m", "rayflow", "backend=vm", *base, *args)

    def run(self, *args: str, env: dict | None = None, timeout: float = 300):
        return subprocess.run(
            self.argv(*args),
            env={**self.env, **(env or {})},
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, *args: str, name: str) -> tuple[subprocess.Popen, Path]:
        log = self.folder / f"{name}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                self.argv(*args),
                env=self.env,
                cwd=self.folder,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return proc, log

    def file(self, name: str, doc: dict) -> Path:
        path = self.folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path


@pytest.fixture
def user(ec2, tmp_path):
    return User(ec2, tmp_path)


def _last_line(out: subprocess.CompletedProcess) -> str:
    return out.stderr.strip().splitlines()[-1]


def _vms(ec2: Ec2Namespace, name: str, owner: str, kind: str = "head", count: int = 1) -> list:
    """VMs of cluster `name` as another party's Ray launcher (or a run of rayflow, `owner`)
    tags them, made straight through the EC2 API; their ids."""
    tags = [
        {"Key": "ray-cluster-name", "Value": name},
        {"Key": "ray-node-type", "Value": kind},
        {"Key": "rayflow-owner", "Value": owner},
    ]
    made = ec2.call(
        "ec2",
        "run_instances",
        ImageId="ami-12c6146b",
        InstanceType="t3.medium",
        MinCount=count,
        MaxCount=count,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    return sorted(i["InstanceId"] for i in made["Instances"])


def _running(ec2: Ec2Namespace, name: str) -> dict[str, list[str]]:
    """The live VMs of cluster `name`, by their owner tag."""
    found: dict[str, list[str]] = {}
    for vm in ec2.instances(name, running_only=True):
        owner = {t["Key"]: t["Value"] for t in vm.get("Tags") or []}.get("rayflow-owner", "")
        found.setdefault(owner, []).append(vm["InstanceId"])
    return {owner: sorted(ids) for owner, ids in found.items()}


def test_rays_aws_files_are_accepted_with_resources_filled_from_the_api(ec2, user):
    """Ray's own AWS file (the one in the installed Ray) and a multi-node-type file without
    `resources`: a dry run fills them from describe_instance_types as `ray up` does; where the
    API does not answer, it says which types `ray up` fills at start instead of refusing."""
    import ray

    shipped = Path(ray.__file__).parent / "autoscaler" / "aws" / "defaults.yaml"
    rays = user.run(f"backend.cluster_yaml={shipped}", "dry_run=true")
    assert rays.returncode == 0, rays.stderr[-3000:]
    types = yaml.safe_load(rays.stdout)["available_node_types"]
    assert types["ray.worker.default"]["node_config"]["InstanceMarketOptions"] == {
        "MarketType": "spot"
    }
    # its `resources: {}` says "detect it": filled as `ray up` fills them (m5.large: 2 vCPUs)
    assert types["ray.head.default"]["resources"] == {"CPU": 2}
    assert types["ray.worker.default"]["resources"]["CPU"] == 2

    multi = user.file("multi", {**MULTI, "cluster_name": "multi"})
    out = user.run(f"backend.cluster_yaml={multi}", "dry_run=true")
    assert out.returncode == 0, out.stderr[-3000:]
    filled = {
        n: t["resources"] for n, t in yaml.safe_load(out.stdout)["available_node_types"].items()
    }
    assert filled["head"] == {"CPU": 2}  # Ray fills a head's CPUs only
    assert filled["cpu_spot"]["CPU"] == 2 and filled["cpu_spot"]["memory"] > 0
    assert filled["gpu"]["CPU"] == 4 and filled["gpu"]["GPU"] == 1

    # no answer at the endpoint: a note, not a refusal
    away = user.run(
        f"backend.cluster_yaml={multi}",
        "dry_run=true",
        env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
    )
    assert away.returncode == 0, away.stderr[-3000:]
    assert (
        "`ray up` fills the resources of cpu_spot, gpu, head from EC2's instance types at start"
        in away.stderr
    )
    assert "the EC2 API does not answer" in away.stderr
    assert "resources" not in yaml.safe_load(away.stdout)["available_node_types"]["gpu"]


def test_every_node_type_gets_the_instance_types_resources_the_files_own_winning(ec2, user):
    """As Ray fills them (fillout_available_node_types_resources): every type, not only those
    without the key; `resources: {}` (Ray's own files' "detect it") gets everything, a map of
    custom resources gets CPUs and memory beside its own keys, a value the file sets stays."""

    def worker(resources=None):
        kind = {"min_workers": 0, "max_workers": 1, "node_config": {"InstanceType": "m5.large"}}
        return kind if resources is None else {**kind, "resources": resources}

    doc = {
        **MULTI,
        "cluster_name": "fill",
        "available_node_types": {
            "head": {"node_config": {"InstanceType": "m5.large"}, "resources": {}},
            "empty": worker({}),
            "custom": worker({"Custom1": 1, "is_spot": 1}),
            "missing": worker(),
            "capped": worker({"CPU": 1}),
            "templated": {  # no InstanceType (a launch template's): Ray cannot fill it
                **worker({"CPU": 8}),
                "node_config": {"LaunchTemplate": {"LaunchTemplateName": "mine"}},
            },
            "gpu": {  # g4dn.xlarge: 4 vCPUs, 1 GPU; the file asks for 2 CPUs
                **worker({"accelerator": 1, "CPU": 2}),
                "node_config": {"InstanceType": "g4dn.xlarge"},
            },
        },
    }
    out = user.run(f"backend.cluster_yaml={user.file('fill', doc)}", "dry_run=true")
    assert out.returncode == 0, out.stderr[-3000:]
    filled = {
        n: t["resources"] for n, t in yaml.safe_load(out.stdout)["available_node_types"].items()
    }
    assert filled["head"] == {"CPU": 2}  # Ray fills a head's CPUs, not its memory
    memory = filled["missing"]["memory"]
    assert memory > 0 and filled["missing"] == {"CPU": 2, "memory": memory}
    assert filled["empty"] == filled["missing"]
    assert filled["custom"] == {"CPU": 2, "memory": memory, "Custom1": 1, "is_spot": 1}
    assert filled["capped"] == {"CPU": 1, "memory": memory}  # the file's value wins
    assert filled["templated"] == {"CPU": 8}
    gpu_memory = filled["gpu"]["memory"]
    assert gpu_memory > memory
    # the file's 2 of 4 vCPUs; the GPU and its type (Ray's accelerator resource) filled
    assert filled["gpu"] == {
        "CPU": 2,
        "GPU": 1,
        "accelerator_type:T4": 1,
        "memory": gpu_memory,
        "accelerator": 1,
    }


def test_wrong_credentials_or_region_are_one_line_before_any_instance(ec2, user):
    wrong = user.run(
        "backend.provider=aws",
        "backend.cluster_name=wrong-key",
        env={"AWS_SECRET_ACCESS_KEY": "not-the-key"},
    )
    assert wrong.returncode == 2, wrong.stderr[-3000:]
    [line] = wrong.stderr.strip().splitlines()
    assert line.startswith(
        "rayflow: error: backend.provider: aws: AWS refused the credentials ("
    ), line
    assert "not-the-key" not in wrong.stderr + wrong.stdout

    region = user.run(
        "backend.provider=aws", "backend.cluster_name=wrong-region", "backend.region=us-weast-2"
    )
    assert region.returncode == 2, region.stderr[-3000:]
    [line] = region.stderr.strip().splitlines()
    assert line.startswith("rayflow: error: backend.region: 'us-weast-2' is not an EC2 region"), (
        line
    )
    assert ec2.instances("wrong-key") == [] and ec2.instances("wrong-region") == []


def test_sigint_and_sigterm_while_provisioning_leave_no_instance(ec2, user):
    """Two starts, overlapping: SIGTERM as Ray's launcher begins creating the head VM, SIGINT once
    the head exists (it runs as Ray's bootstrap role, by its instance profile: no keys go to a
    VM). Each exits as signalled and leaves no instance of its cluster running."""
    # the second starts once the first has made Ray's IAM role (two first `ray up`s at once
    # race to add it to its instance profile, and one is refused: LimitExceeded)
    term, term_log = user.start(
        "backend.provider=aws", "backend.cluster_name=sig-term", name="term"
    )
    intr = None
    try:
        creating = wait_until(
            lambda: (
                "Acquiring an up-to-date head node" in term_log.read_text()
                or term.poll() is not None
            ),
            timeout=240,
            interval=0.05,
        )
        assert creating and term.poll() is None, term_log.read_text()[-3000:]
        term.send_signal(signal.SIGTERM)
        intr, intr_log = user.start(
            "backend.provider=aws", "backend.cluster_name=sig-int", name="int"
        )
        head = wait_until(
            lambda: ec2.instances("sig-int", running_only=True) or intr.poll() is not None,
            timeout=240,
        )
        assert head and intr.poll() is None, intr_log.read_text()[-3000:]
        profile = ec2.call(
            "ec2",
            "describe_iam_instance_profile_associations",
            Filters=[{"Name": "instance-id", "Values": [head[0]["InstanceId"]]}],
        )["IamInstanceProfileAssociations"]
        assert profile and "ray-autoscaler-v1" in profile[0]["IamInstanceProfile"]["Arn"], profile
        intr.send_signal(signal.SIGINT)
        assert term.wait(timeout=300) == 143, term_log.read_text()[-3000:]
        assert intr.wait(timeout=300) == 130, intr_log.read_text()[-3000:]
    finally:
        for proc in (term, intr):
            if proc is not None and proc.poll() is None:
                proc.kill()
    for name, log in (("sig-term", term_log), ("sig-int", intr_log)):
        assert ec2.instances(name, running_only=True) == [], log.read_text()[-3000:]
        assert user.ec2.secret_key not in log.read_text()


def test_a_head_that_never_answers_fails_within_start_timeout_and_no_instance_is_left(ec2, user):
    """The user's multi-node-type file started: Ray's launcher fills the resources, creates the
    head VM and waits for SSH on it (unreachable here); start_timeout_s ends the wait. Another
    party's VM tagged with the same cluster name, made while the launcher works, survives the
    teardown: only VMs with this run's owner tag are terminated."""
    multi = user.file("multi", {**MULTI, "cluster_name": "never-up"})
    started = time.monotonic()
    proc, log = user.start(f"backend.cluster_yaml={multi}", "backend.start_timeout_s=15", name="up")
    try:
        past_check = wait_until(
            lambda: "creating cluster never-up" in log.read_text() or proc.poll() is not None,
            timeout=120,
            interval=0.1,
        )
        assert past_check and proc.poll() is None, log.read_text()[-3000:]
        theirs = _vms(ec2, "never-up", "another-run", kind="worker")
        assert proc.wait(timeout=300) == 1, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines[-1] == (
        "rayflow: error: backend.start_timeout_s: cluster never-up was not up within 15 s "
        "(Ray's launcher was waiting for SSH on the head VM); tearing down what it created"
    ), log.read_text()[-3000:]
    print(f"\nstart_timeout_s=15: exit after {time.monotonic() - started:.1f} s")
    made = [i for i in ec2.instances("never-up") if i["InstanceId"] not in theirs]
    gone = ("shutting-down", "terminated")
    assert made and all(i["State"]["Name"] in gone for i in made), [i["State"] for i in made]
    assert made[0]["InstanceType"] == "m5.large"
    assert _running(ec2, "never-up") == {"another-run": theirs}


def test_a_spot_worker_type_reaches_run_instances_with_its_market_options(ec2, user):
    """Rendered: the spot key on the CPU worker type only; launched as the head's autoscaler
    launches a worker (Ray's AWS node provider, on the config Ray's bootstrap completes), EC2
    gets a spot request."""
    out = user.run(
        "backend.provider=aws",
        "backend.worker.cpu.spot=true",
        "backend.cluster_name=spot",
        "dry_run=true",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    config = yaml.safe_load(out.stdout)
    types = config["available_node_types"]
    assert types["rayflow_worker_cpu"]["node_config"]["InstanceMarketOptions"] == {
        "MarketType": "spot"
    }
    assert "InstanceMarketOptions" not in types["rayflow_head"]["node_config"]
    script = user.folder / "autoscaler.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, sys, yaml
            from ray.autoscaler._private.aws.config import bootstrap_aws
            from ray.autoscaler._private.aws.node_provider import AWSNodeProvider
            from ray.autoscaler._private.util import prepare_config
            config = bootstrap_aws(prepare_config(yaml.safe_load(open(sys.argv[1]))))
            provider = AWSNodeProvider(config["provider"], config["cluster_name"])
            worker = config["available_node_types"]["rayflow_worker_cpu"]["node_config"]
            provider.create_node(worker, {"ray-node-type": "worker"}, 1)
            print(json.dumps(provider.non_terminated_nodes({})))
            """
        )
    )
    (user.folder / "cluster.yaml").write_text(out.stdout)
    made = subprocess.run(
        ec2.argv(sys.executable, str(script), str(user.folder / "cluster.yaml")),
        env=user.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    [instance] = ec2.instances("spot", running_only=True)
    assert instance["InstanceLifecycle"] == "spot", instance
    ec2.call("ec2", "terminate_instances", InstanceIds=[instance["InstanceId"]])
    assert ec2.instances("spot", running_only=True) == []


# What a run that kept cluster `shared` left in its user's cache: the cluster YAML with its owner
# tag on every node type, and the kept record (what `rayflow down` reads). Ray's launcher cannot
# bring a head up here (no SSH to a moto address), so it is written as that run writes it.
KEPT = """
import sys
from rayflow.backends import backend_for, kept
from rayflow.backends.vm import kept as vm_kept, owned, owner
from rayflow.orchestrator.compose import compose_config
from rayflow.schema.values import to_container
name, run, bootstrap = sys.argv[1:]
backend = backend_for(compose_config("backend=vm", "backend.provider=aws", f"backend.cluster_name={name}"))
config = owner.tag(backend.cluster_config(), run)
path = owned.cluster_file(name)
owned.write(path, config)
owned.write(bootstrap, config)  # as Ray's launcher leaves it on the head, for its autostop
kept.keep(kept.KeptCluster(backend="vm", name=name, owner_run=run,
    section=dict(to_container(backend.section)), where=vm_kept.where_sdk("aws", str(path))))
"""


def test_another_partys_vms_of_the_name_are_never_selected(ec2, user):
    """Another party's VMs tagged with the cluster's name: a start with that name is refused in
    one line naming backend.cluster_name; `rayflow down` of this user's kept cluster of the name
    and the head's autostop terminate only the VMs that carry the kept cluster's owner tag."""
    theirs = _vms(ec2, "shared", "another-run", count=2)
    refused = user.run("backend.provider=aws", "backend.cluster_name=shared")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-3000:]
    assert _last_line(refused) == (
        "rayflow: error: backend.cluster_name: 2 VM(s) tagged ray-cluster-name=shared already run "
        "in the account that no cluster you kept started (another run's or another user's); Ray "
        "acts on every VM of a name, so rayflow starts no second cluster of it: give this run a "
        "name of its own (backend.cluster_name=...)"
    )

    bootstrap = user.folder / "home" / "ray_bootstrap_config.yaml"
    made = subprocess.run(
        ec2.argv(sys.executable, "-c", KEPT, "shared", "kept-run", str(bootstrap)),
        env=user.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    ours = _vms(ec2, "shared", "kept-run", count=2)
    down = subprocess.run(
        ec2.argv(sys.executable, "-m", "rayflow", "down", "shared", "--force"),
        env=user.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert down.returncode == 0 and down.stdout.strip() == "[rayflow] shared: torn down", (
        down.stdout + down.stderr[-3000:]
    )
    assert _running(ec2, "shared") == {"another-run": theirs}, ours

    # the head's autostop, from the config Ray's launcher left in its home
    ours = _vms(ec2, "shared", "kept-run", kind="worker") + _vms(ec2, "shared", "kept-run")
    stopped = subprocess.run(
        ec2.argv(sys.executable, "-m", "rayflow.autostop", "--now", "shared"),
        env={
            **user.env,
            "RAYFLOW_AUTOSTOP": '{"backend": "vm", "kind": "node_provider", "owner": "kept-run"}',
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert _running(ec2, "shared") == {"another-run": theirs}, ours

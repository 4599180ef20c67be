"""backend=vm: Ray's cluster launcher. `cluster` (VMCluster: a cluster started, its run submitted
as a Ray Job; a kept one reached and stopped), which starts it as `fake_start` (a fake_multinode
head on this machine, its worker nodes processes here) or `sdk_start` (local, aws, gcp: `ray up`
through Ray's SDK, the head reached through an SSH tunnel), both sharing `start` (one start's
files, its teardown command, the wait for a head's dashboard). What differs by provider is in
`providers`, one module each behind one `Provider` (providers.base): `fake_multinode`,
`local`, and the clouds `aws` and `gcp` on what they share (providers.cloud; providers.ec2: the
EC2 API asked first: region, resources, account): their defaults, checks, part of the cluster
YAML, resources filled in, probes, how a head is found and how their nodes are stopped, one way
each.
`keys` (the `backend:` section's model: its keys) and `rules` (the rules between them, the helpers
that read a section), `config` (the `backend:` section -> the cluster YAML, and the launcher's
environment), `checks` (its keys, the written document's cluster name and the head's exposure,
before anything starts), `commands` (what runs on the nodes) and `defaults` (what they share of
a section: node type names, placeholders); `user_file` (backend.cluster_yaml: the user's own
cluster YAML, read and checked as `ray up` would) and `user_additions` (what rayflow applies over
it); `state` (clusters have owners: this user's record of which run started, kept and holds each
cluster name), `owned` (cluster YAMLs and folders used only as this user's own) and `owner` (every
VM tagged with its run's owner) and `cloud_up` (aws/gcp: `ray up` with an end, every VM of the run
terminated); `kept` (a kept cluster from its record: reached, torn down, autostopped), `teardown`
(`python -m rayflow.backends.vm.teardown PATH`: a cluster stopped after the process that started
it died), `tunnel` (a remote head's dashboard through SSH) and `internals` (the one door to Ray's
private autoscaler modules)."""

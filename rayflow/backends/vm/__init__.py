"""backend=vm: Ray's cluster launcher. `cluster` (VMCluster: `ray up`, or a fake_multinode head,
then the run submitted as a Ray Job), `config` (the `backend:` section -> the cluster YAML),
`checks` (its keys, before anything starts), `commands` (what runs on the nodes) and `defaults`
(the providers' defaults rayflow fills in); `user_file` (backend.cluster_yaml: the user's own
cluster YAML, read and checked as `ray up` would) and `user_additions` (what rayflow applies over
it)."""

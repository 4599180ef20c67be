"""backend=vm: Ray's cluster launcher. `cluster` (VMCluster: `ray up`, or a fake_multinode head,
then the run submitted as a Ray Job), `config` (the `backend:` section -> the cluster YAML),
`checks` (its keys, before anything starts), `commands` (what runs on the nodes) and `defaults`
(the providers' defaults rayflow fills in)."""

"""The built-in workloads, presets of the kinds that run the user's code: cifar (workload=tune with
rayflow's CIFAR trainable and ASHA), ddp (workload=train with rayflow's data-parallel loop) and ppo
(workload=rllib with PPO); the CIFAR-format data set cifar and ddp read (cifar_data, its keys in
conf/workload/data/), the networks they train (models) and their keys (keys)."""

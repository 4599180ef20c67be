"""moto's server for tests/harness/ec2_server.py: `python -m tests.harness.ec2_moto TYPES PORT`.

The region it emulates lists only TYPES (comma-separated) in `describe_instance_types`: Ray's
launcher pages through every instance type at each `ray up` and teardown, and moto's 1395 take
moto about 15 s to page through on two loaded cores. Launching any type still works."""

from __future__ import annotations

import sys

from moto.ec2.models.instance_types import InstanceTypeBackend
from moto.server import main

offered = set(sys.argv[1].split(","))
InstanceTypeBackend.instance_types = [
    t for t in InstanceTypeBackend.instance_types if t["InstanceType"] in offered
]
main(["-H", "127.0.0.1", "-p", sys.argv[2]])

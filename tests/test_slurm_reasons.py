"""Against a private slurmctld (tests/slurm_cluster.py): what ``sinfo -R`` shows of our reasons, and
one node read with ``sinfo -n NODE``: the same node as ``scontrol show node`` says, slurmctld
asked for that node alone, a reason with ``|`` and newlines read whole."""

from __future__ import annotations

from typing import Any

from slurm_cluster import SlurmCluster, drained, requires_slurm, slurm_cluster  # noqa: F401

from nodehealth.observations import ProbeError
from nodehealth.platform.deadline import Deadline
from nodehealth.slurm.client import Scontrol

pytestmark = requires_slurm()

HOST_CHECKS = ("host_mounts", "host_shared_dir", "host_infiniband")


def client(c: SlurmCluster, sinfo: Any = None) -> Scontrol:
    return Scontrol("/usr/bin/scontrol", 10.0, Deadline(60.0), environ={"SLURM_CONF": str(c.conf)}, sinfo=sinfo)


def test_sinfo_R_shows_the_code_and_the_gpu_and_one_node_is_read_alone(slurm_cluster) -> None:  # noqa: F811
    c: SlurmCluster = slurm_cluster(
        scenario="remap-pending.toml", hc_interval=1, ghosts=40, nodehealth={"disable": HOST_CHECKS}
    )
    # slurmd's health check can drain the node before slurmd has registered (UNKNOWN+DRAIN); the
    # node's base state then moves to IDLE on its own, between any two reads compared below.
    c.wait_node(
        lambda n: drained(n) and n["reason"].startswith("nh:") and not n["scontrol_state"].startswith("UNKNOWN"),
        60,
        "drained by the health check, registered",
    )
    # sinfo -R in its default format: REASON is 20 characters wide.
    lines = c.run("/usr/bin/sinfo", "-R").stdout.splitlines()
    ours = [line for line in lines if line.rstrip().endswith(c.host)]
    assert ours and ours[0][:20] == "nh:rowremap GPU1 gpu", lines

    # One node through nodehealth's client: sinfo -n, the same node as scontrol's record of it.
    via_sinfo, via_scontrol = client(c), client(c, sinfo="")
    assert via_sinfo.sinfo == "/usr/bin/sinfo"
    before = c.sdiag_counts()
    got = via_sinfo.show(c.host)
    after = c.sdiag_counts()
    assert not isinstance(got, ProbeError), got
    want = via_scontrol.show(c.host)
    assert not isinstance(want, ProbeError), want
    (a,), (b,) = got, want
    assert (a.name, a.state, a.reason, a.gres_gpus) == (b.name, b.state, b.reason, b.gres_gpus)
    assert a.drained_by_us and a.gres_gpus == 8 and a.reason is not None and a.reason.user == "root"
    # slurmctld packed one node (REQUEST_NODE_INFO_SINGLE), never the node table (REQUEST_NODE_INFO).
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert delta.get("REQUEST_NODE_INFO_SINGLE", 0) >= 1 and delta.get("REQUEST_NODE_INFO", 0) == 0, delta

    # A reason with '|' and a newline followed by a record-shaped line, set through Slurm itself.
    hostile = "hold|do not resume\nghost7|idle|gpu:8|root|now|fine"
    c.run("/usr/bin/scontrol", "update", "nodename=ghost7", "state=drain", f"reason={hostile}")
    got = via_sinfo.show("ghost7")
    assert not isinstance(got, ProbeError), got
    (g,) = got
    assert g.drained and g.reason is not None and g.reason.text == hostile and not g.drained_by_us

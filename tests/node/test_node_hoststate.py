"""The host-state check can fail: changes planted on the machine show in its diff, and once they
are removed the machine compares equal again (so an equal result means something)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_agents_testkit.localcluster import hoststate
from durable_agents_testkit.localcluster.node import NodeError, NodeNetwork, NodeTestBed, reap_orphans


def _sh(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, timeout=30)


@pytest.fixture
def planted() -> Iterator[dict[str, str]]:
    """An iptables chain, a network device, a mount, a cgroup and a fixed host path, all made
    here and all removed again exactly (the iptables table too when it did not exist)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    tag = uuid.uuid4().hex[:6]
    names = {
        "chain": f"DA-PLANTED-{tag}",
        "link": f"da-plant{tag}",
        "mount": tempfile.mkdtemp(prefix="da-planted-"),
        "cgroup": f"da-planted-{tag}",
        "path": "/var/lib/cni" if not os.path.lexists("/var/lib/cni") else f"/etc/cni-planted-{tag}",
    }
    had_filter = "*filter" in subprocess.run(["iptables-nft-save"], capture_output=True, text=True).stdout
    cgroup = hoststate.cgroup_hierarchies()[0] / names["cgroup"]
    try:
        yield names | {"plant": "1"}
    finally:
        subprocess.run(["iptables-nft", "-w", "-t", "filter", "-X", names["chain"]], capture_output=True)
        if not had_filter:
            subprocess.run(["nft", "delete", "table", "ip", "filter"], capture_output=True)
        subprocess.run(["ip", "link", "del", names["link"]], capture_output=True)
        subprocess.run(["umount", names["mount"]], capture_output=True)
        os.rmdir(names["mount"])
        if cgroup.exists():
            cgroup.rmdir()
        shutil.rmtree(names["path"], ignore_errors=True)


def _plant(names: dict[str, str]) -> None:
    _sh("iptables-nft", "-w", "-t", "filter", "-N", names["chain"])
    _sh("ip", "link", "add", names["link"], "type", "bridge")
    _sh("mount", "-t", "tmpfs", "-o", "size=1m", "da-planted", names["mount"])
    (hoststate.cgroup_hierarchies()[0] / names["cgroup"]).mkdir()
    Path(names["path"]).mkdir()


def _unplant(names: dict[str, str], had_filter: bool) -> None:
    _sh("iptables-nft", "-w", "-t", "filter", "-X", names["chain"])
    if not had_filter:
        _sh("nft", "delete", "table", "ip", "filter")
    _sh("ip", "link", "del", names["link"])
    _sh("umount", names["mount"])
    (hoststate.cgroup_hierarchies()[0] / names["cgroup"]).rmdir()
    Path(names["path"]).rmdir()


def test_the_check_sees_planted_changes_and_their_removal(planted: dict[str, str]) -> None:
    had_filter = "*filter" in subprocess.run(["iptables-nft-save"], capture_output=True, text=True).stdout
    before = hoststate.snapshot()
    assert hoststate.compare(before, hoststate.snapshot()) == ""
    _plant(planted)
    diff = hoststate.compare(before, hoststate.snapshot())
    for what in ("chain", "link", "mount", "cgroup", "path"):
        assert planted[what] in diff, f"{what} {planted[what]} not in the diff:\n{diff}"
    with pytest.raises(hoststate.HostStateChanged, match=planted["chain"]):
        hoststate.assert_unchanged(before, hoststate.snapshot())
    _unplant(planted, had_filter)
    assert hoststate.compare(before, hoststate.snapshot()) == ""


def test_the_beds_own_check_sees_its_network_and_a_planted_chain(node_bed: NodeTestBed) -> None:
    """While the bed runs, the comparison it makes at teardown shows what it made (its veth, its
    routes, its cgroup root) and a chain planted on the machine; stop() would fail on either."""
    assert node_bed.network is not None
    chain = f"DA-PLANTED-{uuid.uuid4().hex[:6]}"
    had_filter = "*filter" in subprocess.run(["iptables-nft-save"], capture_output=True, text=True).stdout
    _sh("iptables-nft", "-w", "-t", "filter", "-N", chain)
    try:
        diff = node_bed.host_diff()
    finally:
        _sh("iptables-nft", "-w", "-t", "filter", "-X", chain)
        if not had_filter:
            _sh("nft", "delete", "table", "ip", "filter")
    for made in (chain, node_bed.network.host_link, node_bed.network.pod_cidr, node_bed.network.cgroup_root):
        assert made in diff, f"{made} not in:\n{diff}"
    assert chain not in node_bed.host_diff()


def test_a_bed_whose_owner_was_killed_is_removed_by_the_next(node_bed: NodeTestBed) -> None:
    """A test run stopped with SIGKILL leaves its bed running; the next bed on the machine finds
    it (by its record under the cache) and removes it, namespaces, veth, cgroups and all."""
    script = (
        "from durable_agents_testkit.localcluster.node import NodeTestBed\n"
        "import sys, time\n"
        "bed = NodeTestBed()\n"
        "bed.start()\n"
        "print(bed.network.slot, bed.work_dir, flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline().split()  # returns once the orphan-to-be is Ready
    finally:
        owner.kill()
        owner.wait()
    assert line, "the second bed did not start"
    slot, work_dir = int(line[0]), line[1]
    orphan = NodeNetwork(slot)
    assert orphan.host_link in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert reap_orphans() == [work_dir]
    assert orphan.host_link not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not any((h / orphan.cgroup_root).exists() for h in hoststate.cgroup_hierarchies())
    assert not os.path.exists(work_dir)


def test_a_bed_that_fails_to_start_puts_the_machine_back(node_bed: NodeTestBed, tmp_path: Path) -> None:
    """A kubelet that exits at once: start() fails naming it, and everything made is gone."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for binary in node_bed.bin_dir.iterdir():
        (bin_dir / binary.name).symlink_to(binary)
    (bin_dir / "kubelet").unlink()
    (bin_dir / "kubelet").write_text("#!/bin/sh\necho 'a kubelet that fails' >&2\nexit 3\n")
    (bin_dir / "kubelet").chmod(0o755)
    before = hoststate.snapshot()
    bed = NodeTestBed(tmp_path / "bed", bin_dir=bin_dir)
    with pytest.raises(NodeError, match="kubelet exited") as failure:
        bed.start()
    assert "a kubelet that fails" in str(failure.value)
    assert hoststate.compare(before, hoststate.snapshot()) == ""
    assert (tmp_path / "bed" / "node" / "logs" / "kubelet.log").exists()  # kept for the post-mortem

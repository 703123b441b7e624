"""Configuration precedence: environment over file over defaults; nodes from the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.nodes.inventory import resolve_nodes
from orchestrator.settings import DEFAULT_HOME, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith("GRIDSHIFT_"):
            monkeypatch.delenv(key)


def test_defaults():
    s = load_settings()
    assert s.home == DEFAULT_HOME and s.db_url == f"sqlite:///{DEFAULT_HOME / 'gridshift.db'}"


def test_environment_over_file_over_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("GRIDSHIFT_HOME", str(tmp_path))
    (tmp_path / "gridshift.toml").write_text("fake_gpus = 2\ncancel_grace_s = 3\n")
    s = load_settings()
    assert s.fake_gpus == 2 and s.cancel_grace_s == 3 and s.daemon_interval_s == 1.0
    monkeypatch.setenv("GRIDSHIFT_FAKE_GPUS", "6")
    assert load_settings().fake_gpus == 6


def test_explicit_config_path_and_nodes(tmp_path):
    config = tmp_path / "lab.toml"
    config.write_text(
        'database_url = "sqlite:////tmp/x.db"\n'
        '[[nodes]]\nname = "box1"\nfake_gpus = 8\ngpu_model = "A100"\nrack = "r1"\n'
        '[[nodes]]\nname = "box2"\nexecutor = "ssh"\nhost = "10.0.0.2"\ngpus = 4\n'
    )
    s = load_settings(config)
    assert s.db_url == "sqlite:////tmp/x.db"
    nodes = resolve_nodes(s, detect=lambda: [])
    assert [(n.name, n.gpu_count, n.gpu_source) for n in nodes] == [
        ("box1", 8, "fake"),
        ("box2", 4, "config"),
    ]
    assert nodes[0].gpu_model == "A100" and nodes[1].host == "10.0.0.2"


def test_no_nodes_means_one_local_node_with_detected_gpus(tmp_path):
    from executors.gpu import GpuInfo

    s = load_settings()
    found = [GpuInfo(index=i, uuid=f"GPU-{i}", model="H100") for i in range(2)]
    (node,) = resolve_nodes(s, detect=lambda: found)
    assert node.executor == "local" and node.gpu_count == 2 and node.gpu_source == "nvml"
    (none,) = resolve_nodes(s, detect=lambda: [])
    assert none.gpu_count == 0 and none.gpu_source == "none"


_SLURM = "[[nodes]]\nname = 'c'\nexecutor = 'slurm'\ngpus = 4\n"


@pytest.mark.parametrize(
    "text,message",
    [
        ("fake_gpus = -1", "fake_gpus"),
        ("[[nodes]]\nname = 'a'\n[[nodes]]\nname = 'a'\n", "unique"),
        ("[[nodes]]\nname = 'a'\nexecutor = 'k8s'\n", "nodes.0.executor"),
        ("not toml at all", "gridshift.toml"),
        ("colour = 'blue'", "colour"),
        # issue 24's keys: a contradiction is refused, not silently ignored
        (_SLURM + "share = 'time-slice'\n", "Slurm node"),
        ("[[nodes]]\nname = 'a'\nshare = 'mps'\nshare_users = 'any'\n", "time-slice"),
        # a number is not true or false (pydantic would read true as 1)
        ("[[nodes]]\nname = 'a'\npue = true\n", "nodes.0.pue"),
        ("[[nodes]]\nname = 'a'\ngpu_idle_w = true\n", "nodes.0.gpu_idle_w"),
        ("[[nodes]]\nname = 'a'\nnode_idle_w = false\n", "nodes.0.node_idle_w"),
        ("[daemon]\npue = true\n", "daemon.pue"),
    ],
)
def test_bad_config_is_a_config_error(tmp_path, monkeypatch, text, message):
    monkeypatch.setenv("GRIDSHIFT_HOME", str(tmp_path))
    Path(tmp_path / "gridshift.toml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings()


def test_the_example_config_is_valid():
    from tests.conftest import ROOT

    s = load_settings(ROOT / "configs" / "gridshift.example.toml")
    assert s.nodes[0].name == "gpu-box-1" and s.grid.source == ["uk"]


def test_nvlink_islands_from_the_config_set_the_buddy_order(tmp_path):
    from orchestrator.nodes.inventory import topology

    config = tmp_path / "c.toml"
    config.write_text(
        '[[nodes]]\nname = "dgx"\nfake_gpus = 8\nrack = "r1"\n'
        "nvlink_islands = [[0, 2, 4, 6], [1, 3, 5, 7]]\n"
    )
    (node,) = topology(resolve_nodes(load_settings(config))).nodes
    assert node.order == (0, 2, 4, 6, 1, 3, 5, 7) and node.rack == "r1"

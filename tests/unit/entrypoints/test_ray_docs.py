"""The `ray up` example (docs/ray/cluster.yaml) is a cluster config Ray's own schema accepts,
its node types are labelled with the resources the minipd command it ends with asks for, and
that command parses with minipd's own flags; an instance on a Ray node binds the node's address."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("ray")
from ray.autoscaler._private.util import fillout_defaults, validate_config  # noqa: E402

from minipd.control.role import Role  # noqa: E402
from minipd.entrypoints.flags import build_parser  # noqa: E402
from minipd.entrypoints.ray_instance import on_node  # noqa: E402

CLUSTER_YAML = Path(__file__).parents[3] / "docs" / "ray" / "cluster.yaml"


def _command() -> list[str]:
    """The minipd command in the file's closing comment, as argv."""
    lines = CLUSTER_YAML.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#   minipd "))
    text = " ".join(line.lstrip("# ").rstrip("\\ ") for line in lines[start:])
    return shlex.split(text)


def test_the_cluster_yaml_is_valid_for_ray_up():
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    validate_config(fillout_defaults(config))  # raises naming what is wrong
    broken = {**config, "available_node_types": {**config["available_node_types"], "head": {"resources": 1}}}
    with pytest.raises(jsonschema.ValidationError, match="node_config"):
        validate_config(fillout_defaults(broken))


def test_its_node_types_carry_the_resources_its_command_asks_for():
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    argv = _command()
    assert argv[0] == "minipd"
    args = build_parser(Role.CLUSTER).parse_args(argv[1:])
    assert args.launcher == "ray" and args.device == "cuda"
    types = config["available_node_types"]
    for asked in (dict(args.ray_prefill_resources), dict(args.ray_decode_resources)):
        (name,) = asked
        labelled = [t for t in types.values() if t["resources"].get(name, 0) >= asked[name]]
        assert labelled and all(t["resources"]["GPU"] >= t["resources"][name] for t in labelled), (name, types)
    assert types[config["head_node_type"]]["resources"] == {"CPU": 0}  # nothing placed on the head
    assert json.dumps(types)  # plain data


def test_an_instance_binds_its_node_address_in_place_of_the_launchers_host():
    assert on_node(["--port", "0", "--host", "127.0.0.1", "--x"], "10.0.0.7") == [
        "--port", "0", "--host", "10.0.0.7", "--x",
    ]  # fmt: skip
    assert on_node(["--host", "a", "--host", "0.0.0.0"], "10.0.0.7") == ["--host", "a", "--host", "10.0.0.7"]
    assert on_node(["--port", "0"], "10.0.0.7") == ["--port", "0", "--host", "10.0.0.7"]
